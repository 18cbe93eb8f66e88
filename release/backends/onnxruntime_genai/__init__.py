"""The onnxruntime-genai backend: onnxruntime-genai's model builder exports the checkpoint (KV cache, fused
attention, MatMulNBits int4/int8, genai_config.json), onnxruntime-genai serves it inside relctl's server
(og.Engine batching or a generator per request), and plain onnxruntime runs model.onnx for teacher-forced
logits during validation.

Heavy imports (onnxruntime_genai, onnx) happen inside the methods: finding the backend costs nothing.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.backends.base import (
    Backend,
    BatchProbe,
    Deploy,
    ExportResult,
    Flavour,
    LoadedModel,
    MemoryFacts,
    Support,
    architecture,
    unnamed_architecture,
)
from release.backends.onnxruntime_genai.families import GENAI_ARCHITECTURES, genai_config_problems
from release.core.units import size

if TYPE_CHECKING:
    from release.backends.base import Runner
    from release.core.server_settings import ServerSettings

GENAI_CONFIG = "genai_config.json"
MODEL_FILE = "model.onnx"

# The builder's own list of valid precision/provider pairs (it prints it and then builds anyway: an fp16
# CPU graph that fails at the second generation step, so relctl refuses it up front).
GENAI_COMBINATIONS = frozenset({
    ("fp32", "cpu"), ("fp32", "cuda"), ("fp16", "cuda"), ("int8", "cpu"), ("int8", "cuda"),
    ("int4", "cpu"), ("int4", "cuda"),
})
TOOLS = ("onnxruntime-genai", "onnx", "onnxruntime")


class OnnxruntimeGenaiBackend(Backend):
    id = "onnxruntime-genai"
    distribution = "onnxruntime-genai"
    precisions = ("fp32", "fp16", "int8", "int4")
    execution_providers = ("cpu", "cuda")
    runtime_files = (GENAI_CONFIG, MODEL_FILE)
    # Validated against PyTorch on the checkpoint: no fp32 ONNX is built only to be compared with, and an
    # fp32 release is compared with numbers it did not compute itself.
    reference_from_checkpoint = True
    families = "decoder LLMs of onnxruntime-genai's model builder (" + ", ".join(
        sorted(a.removesuffix("ForCausalLM") for a in GENAI_ARCHITECTURES)) + ")"

    def supports(self, config: dict[str, Any]) -> Support:
        arch = architecture(config)
        if not arch:
            return unnamed_architecture(config)
        if arch not in GENAI_ARCHITECTURES:
            return Support.no(arch, f"{arch} is not a family its model builder exports")
        problems = genai_config_problems(config)
        if problems:
            return Support.no(arch, f"its model builder cannot build this {arch}: {'; '.join(problems)}")
        return Support.yes(arch)

    def recognizes(self, model_dir: Path) -> bool:
        # The graph alone marks a genai build: the memory plan reads a folder that has nothing else.
        return (model_dir / MODEL_FILE).is_file()

    def target_problem(self, precision: str, execution_provider: str) -> str | None:
        problem = super().target_problem(precision, execution_provider)
        if problem is None and (precision, execution_provider) not in GENAI_COMBINATIONS:
            return (f"{precision} on execution provider '{execution_provider}' is not a combination its builder "
                    "supports (fp16 is a GPU precision: set convert.execution_provider to cuda, or pick "
                    "fp32/int8/int4 for cpu)")
        return problem

    def export(self, checkpoint: Path, out: Path, precision: str, execution_provider: str,
               log_path: Path) -> ExportResult:
        from release.backends.onnxruntime_genai import builder  # noqa: PLC0415 - loads onnxruntime_genai

        peak = builder.run_builder(checkpoint, out, precision, execution_provider, log_path)
        notes = builder.align_tokenizer(checkpoint, out)
        if peak is not None:
            notes.append(f"model builder peak RSS {size(peak)}")
        parity = builder.check_tokenizer_parity(checkpoint, out)
        return ExportResult(versions=tool_versions(), tokenizer_parity=parity, notes=notes)

    def load(self, model_dir: Path, execution_provider: str = "cpu") -> LoadedModel:
        from release.backends.onnxruntime_genai.model import GenaiModel  # noqa: PLC0415 - native libraries

        return GenaiModel.load(model_dir, execution_provider)

    def load_reference(self, model_dir: Path) -> LoadedModel:
        # A built folder (`relctl validate REFERENCE CANDIDATE` with an fp32 build) runs as it is; a
        # checkpoint runs in PyTorch (release/backends/torch_reference.py).
        if self.recognizes(model_dir):
            return self.load(model_dir)
        from release.backends.torch_reference import TorchReference  # noqa: PLC0415 - loads torch

        return TorchReference(model_dir)

    def runtime_config(self, model_dir: Path) -> dict[str, Any]:
        path = model_dir / GENAI_CONFIG
        data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        return data

    def memory_facts(self, model_dir: Path, declared_precision: str | None) -> MemoryFacts:
        from release.memory.package import read_model_folder  # noqa: PLC0415 - loads onnx

        facts = read_model_folder(model_dir, {}, declared_precision)
        return MemoryFacts(weights_bytes=facts.weights_bytes, kv_dtype_bytes=facts.kv_dtype_bytes,
                           precision=facts.precision, provider=facts.provider)

    def batch_probe(self, model_dir: Path, provider: str) -> BatchProbe | None:
        from release.backends.onnxruntime_genai.measure import GenaiBatchProbe, cuda_available  # noqa: PLC0415

        if provider == "cuda" and not cuda_available():
            return None
        return GenaiBatchProbe(model_dir, provider)

    def open_runner(self, model_dir: Path, settings: ServerSettings) -> Runner:
        from release.backends.onnxruntime_genai.runner import GenaiRunner  # noqa: PLC0415 - native libraries

        return GenaiRunner(model_dir, settings)

    def flavour(self) -> Flavour:
        return Flavour("onnx", model_file=MODEL_FILE, pip_requirements=tuple(f"{n}=={v}" for n, v in
                                                                             tool_versions().items()))

    def deploy(self) -> Deploy:
        return Deploy(image="relctl-serve", dockerfile="Dockerfile", requirements=TOOLS)


def tool_versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in TOOLS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found
