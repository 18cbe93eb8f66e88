"""The onnxruntime-genai backend: onnxruntime-genai's model builder exports the checkpoint (KV cache, fused
attention, MatMulNBits int4/int8, genai_config.json), onnxruntime-genai serves it inside relctl's server
(og.Engine batching or a generator per request), and plain onnxruntime runs model.onnx for teacher-forced
logits during validation.

Heavy imports (onnxruntime_genai, onnx) happen inside the methods: finding the backend costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from release.backends.base import (
    AdapterMount,
    AdapterRunner,
    Backend,
    BatchProbe,
    Deploy,
    Deployment,
    ExportResult,
    Flavour,
    FlavourModel,
    LoadedModel,
    LogprobSupport,
    MemoryFacts,
    Support,
    TensorInfo,
    architecture,
    unnamed_architecture,
)
from release.backends.onnxruntime_genai.adapters import GenaiSettings
from release.backends.onnxruntime_genai.families import GENAI_ARCHITECTURES, genai_config_problems
from release.backends.planning import GIB, EnginePlan, Target, check_context
from release.backends.variants import parse_variant
from release.core.errors import InputError
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
# relctl serve's own process beside the plan's model memory (Python, its HTTP stack, ONNX Runtime's
# libraries), rounded up: a limit that is too tight is an OOM kill mid-traffic.
SERVE_PROCESS_BYTES = 1 * GIB


class OnnxruntimeGenaiBackend(Backend):
    id = "onnxruntime-genai"
    preference = 10  # auto tries it first: the built-in every example and test was released through
    display_name = "ONNX"
    distribution = "onnxruntime-genai"
    precisions = ("fp32", "fp16", "int8", "int4")
    execution_providers = ("cpu", "cuda")
    runtime_files = (GENAI_CONFIG, MODEL_FILE)
    settings_model = GenaiSettings
    deploy_files = (f"model/{GENAI_CONFIG}",)
    # Validated against PyTorch on the checkpoint: no fp32 ONNX is built only to be compared with, and an
    # fp32 release is compared with numbers it did not compute itself.
    reference_from_checkpoint = True
    # The runner reads the generator's own logits output: the prompt's (echo) and each generated token's.
    logprobs = LogprobSupport(generated=True, prompt=True)
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

    def target_problem(self, precision: str, execution_provider: str, check_env: bool = True) -> str | None:
        from release.backends.onnxruntime_genai.quantizers import installed_options, variant_problem  # noqa: PLC0415

        variant = parse_variant(precision)
        problem = super().target_problem(variant.precision, execution_provider)
        if problem is None and (variant.precision, execution_provider) not in GENAI_COMBINATIONS:
            return (f"{variant.precision} on execution provider '{execution_provider}' is not a combination its "
                    "builder supports (fp16 is a GPU precision: set convert.execution_provider to cuda, or pick "
                    "fp32/int8/int4 for cpu)")
        return problem or variant_problem(variant, installed_options())

    def precision_variants(self, config: dict[str, Any], execution_provider: str) -> list[str]:
        """Every precision this device builds (fp16 only on a GPU: the builder's fp16 CPU graph crashes), and
        at int4 each quantizer method and int8 placement the installed builder lists (quantizers.py)."""
        from release.backends.onnxruntime_genai.quantizers import installed_options  # noqa: PLC0415

        plain = [p for p in super().precision_variants(config, execution_provider)]
        extra = [v.name for v in installed_options().int4_variants()] if "int4" in plain else []
        return [*plain, *extra]

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
        from release.backends.onnxruntime_genai.lean import LeanCpuModel, runs_lean  # noqa: PLC0415
        from release.backends.onnxruntime_genai.model import GenaiModel  # noqa: PLC0415 - native libraries

        if runs_lean(model_dir, execution_provider):  # fp16 on the CPU kernels: no fp32 copy of the weights
            return LeanCpuModel(model_dir)
        return GenaiModel.load(model_dir, execution_provider)

    def load_reference(self, model_dir: Path) -> LoadedModel:
        # A built folder (`relctl validate REFERENCE CANDIDATE` with an fp32 build) runs as it is; a
        # checkpoint runs in PyTorch: streamed where the family is supported (release/backends/
        # streamed_reference.py), else transformers (release/backends/torch_reference.py).
        if self.recognizes(model_dir):
            return self.load(model_dir)
        from release.backends.streamed_reference import load_checkpoint_reference  # noqa: PLC0415 - loads torch

        reference: LoadedModel = load_checkpoint_reference(model_dir)
        return reference

    def runtime_config(self, model_dir: Path) -> dict[str, Any]:
        path = model_dir / GENAI_CONFIG
        from release.core.jsonfile import load_json_object  # noqa: PLC0415

        return load_json_object(path, hint="rebuild the folder with relctl convert", missing_ok=True)

    def memory_facts(self, model_dir: Path, declared_precision: str | None) -> MemoryFacts:
        from release.backends.onnxruntime_genai.folder import read_model_folder  # noqa: PLC0415 - loads onnx

        return read_model_folder(model_dir, declared_precision)

    def plan(self, source: Path, target: Target, precision: str | None = None,
             settings: dict[str, Any] | None = None, measure: bool = False,
             overlap_bytes: int | None = None) -> EnginePlan:
        """The KV cache sized for the load (past_present_share_buffer: max_length for every sequence), the
        largest forward pass's workspace and the runtime's overhead (release/backends/onnxruntime_genai/plan.py);
        the precisions that would fit instead. Nothing to measure against here: benchmarks/memory.py fits it."""
        from release.backends.onnxruntime_genai.verdict import engine_plan, load_spec, make_plan  # noqa: PLC0415
        from release.backends.shape import PRECISIONS  # noqa: PLC0415

        if settings:
            raise InputError(f"{next(iter(settings))}: the {self.id} plan takes no engine options",
                             hint="drop the option (relctl plan --help lists each engine's)")
        if precision is not None and precision not in PRECISIONS:
            raise InputError(f"--precision: the {self.id} plan lays out {', '.join(PRECISIONS)}, not {precision}",
                             hint=f"plan one of {', '.join(PRECISIONS)}")
        spec = load_spec(source, precision, target.provider)
        check_context(spec.shape, target.context, target.context_setting)
        return engine_plan(make_plan(spec, target, overlap_bytes), self.id)

    def plot_plan(self, plan: EnginePlan, out: Path) -> Path:
        from release.backends.onnxruntime_genai.plot import plot_plan  # noqa: PLC0415 - loads matplotlib

        # The curve re-plans the replica being replaced as the plan did (its bytes, or one like this re-sized
        # with each concurrency), so it crosses the budget at the plan's own largest concurrency.
        return plot_plan(plan.native, out, plan.native.overlap_bytes)

    def plan_lines(self, plan: EnginePlan) -> list[str]:
        from release.backends.onnxruntime_genai.verdict import plan_lines  # noqa: PLC0415

        return plan_lines(plan.native)

    def check_environment(self, model_dir: Path | None = None, device: str = "cpu") -> None:
        from release.backends.onnxruntime_genai.gpu_env import check_ort_builds, require_cuda  # noqa: PLC0415

        check_ort_builds()  # two ORT builds in one environment would time the wrong runtime
        if device == "cuda" and model_dir is not None:
            require_cuda(model_dir / MODEL_FILE)  # the provider a session really runs on, not the available list

    def batch_probe(self, model_dir: Path, provider: str) -> BatchProbe | None:
        from release.backends.onnxruntime_genai.measure import GenaiBatchProbe, cuda_available  # noqa: PLC0415

        if provider == "cuda" and not cuda_available():
            return None
        return GenaiBatchProbe(model_dir, provider)

    # -- adapters: a LoRA-ready base (convert.onnxruntime-genai.adapters) takes .onnx_adapter files at run time
    def shape_export(self, out: Path, settings: BaseModel | None) -> list[str]:
        from release.backends.onnxruntime_genai.adapters import make_lora_ready  # noqa: PLC0415 - loads onnx

        ready = settings.adapters if isinstance(settings, GenaiSettings) else None
        return make_lora_ready(out, ready.target_modules) if ready is not None else []

    def adapter_problem(self, precision: str) -> str | None:
        # Any precision: the LoRA path is float beside the base's own (int4 MatMulNBits included). Whether the
        # base was built LoRA-ready, and for the adapter's modules, is read from its graph at export_adapter.
        return None

    def export_adapter(self, adapter_dir: Path, model_dir: Path, out: Path) -> None:
        from release.backends.onnxruntime_genai import adapters  # noqa: PLC0415 - onnx, onnxruntime

        adapters.export(adapter_dir, model_dir, out)

    def load_with_adapter(self, model_dir: Path, adapter_dir: Path) -> LoadedModel:
        from release.backends.onnxruntime_genai.adapter_runner import GenaiAdapterModel  # noqa: PLC0415
        from release.backends.onnxruntime_genai.model import GenaiModel  # noqa: PLC0415 - native libraries

        return GenaiAdapterModel(GenaiModel.load(model_dir), adapter_dir)

    def open_adapter_runner(self, model_dir: Path, settings: ServerSettings,
                            adapters: Mapping[str, Path]) -> AdapterRunner:
        from release.backends.onnxruntime_genai.adapter_runner import GenaiAdapterRunner  # noqa: PLC0415

        return GenaiAdapterRunner(model_dir, settings, adapters)

    def adapter_deploy_args(self, adapters: Sequence[AdapterMount]) -> list[str]:
        # Its packages are served by `relctl serve` (templates/kserve-inferenceservice.yaml), which loads each
        # pinned package folder the init containers pulled, verifying it and its binding to the base again.
        return [arg for a in adapters for arg in ("--adapter-package", f"{a.model}/{a.version}={a.package_dir}")]

    def open_runner(self, model_dir: Path, settings: ServerSettings) -> Runner:
        from release.backends.onnxruntime_genai.runner import GenaiRunner  # noqa: PLC0415 - native libraries

        return GenaiRunner(model_dir, settings)

    def flavour(self) -> Flavour:
        return Flavour("onnx", model_file=MODEL_FILE, pip_requirements=tuple(f"{n}=={v}" for n, v in
                                                                             tool_versions().items()))

    def flavour_model(self, model_dir: Path) -> FlavourModel | None:
        """MLflow's onnx flavour of model.onnx: the graph without its weights (its initializers still point at
        their external-data files, which are logged beside it as they are) and a named signature. An adapter's
        package has no graph (its .onnx_adapter overrides the base's): its files are logged as they are."""
        import numpy as np  # noqa: PLC0415
        import onnx  # noqa: PLC0415 - only registering a version needs it

        if not (model_dir / MODEL_FILE).is_file():
            return None

        graph = onnx.load(str(model_dir / MODEL_FILE), load_external_data=False)

        def info(value: Any) -> TensorInfo:
            ttype = value.type.tensor_type
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)).name
            return TensorInfo(value.name, dtype, tuple(d.dim_value if d.HasField("dim_value") else -1
                                                      for d in ttype.shape.dim))

        data = sorted({e.value for tensor in graph.graph.initializer for e in tensor.external_data
                       if e.key == "location"})
        return FlavourModel(model=graph, inputs=tuple(info(v) for v in graph.graph.input),
                            outputs=tuple(info(v) for v in graph.graph.output),
                            side_files=tuple(model_dir / name for name in data),
                            log_options={"save_as_external_data": False})

    def deploy(self) -> Deploy:
        return Deploy(image="relctl-serve", dockerfile="Dockerfile", requirements=TOOLS)

    def deployment(self, files: dict[str, dict[str, Any]], memory: dict[str, float],
                   device: str | None = None) -> Deployment:
        """relctl serve runs it, only on the device genai_config.json names: the builder bakes the execution
        provider into the graph (a CPU build on a GPU node would run on its CPU; a CUDA build does not load
        without one)."""
        built = provider_of(files.get(f"model/{GENAI_CONFIG}", {}))
        per_replica = memory.get("per_replica_bytes")
        why = ("was built for CPU (execution provider cpu): on a GPU node it would run on the node's CPU"
               if built == "cpu" else "was built for CUDA (execution provider cuda), which does not load without a GPU")
        return Deployment(validated_device=built, runs_on=(built,), template="kserve-inferenceservice.yaml",
                          memory_bytes=int(per_replica) + SERVE_PROCESS_BYTES if per_replica else None,
                          why_not=why)


def provider_of(genai_config: dict[str, Any]) -> str:
    """onnxruntime-genai names the execution provider it was built for in its decoder's session options."""
    options = genai_config.get("model", {}).get("decoder", {}).get("session_options", {})
    providers = [name for entry in options.get("provider_options", []) for name in entry]
    return "cuda" if "cuda" in providers else "cpu"


def tool_versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in TOOLS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found
