"""The llama.cpp backend: the merged checkpoint as one GGUF file, built by llama.cpp's own converter and
llama-quantize, validated and served by llama-server (the engine behind Ollama and LM Studio).

Nothing of llama.cpp is imported into relctl's process except its gguf-py, to read a GGUF's header. The
tools are built once per machine by `make llama-cpp-env` (release/backends/llama_cpp/build.py) from the
llama-cpp-python 0.3.36 sdist's vendored llama.cpp (the registry has no wheel) and found through
RELCTL_LLAMA_CPP_HOME (release/backends/llama_cpp/toolchain.py).

- export (export.py): fp16, q8_0, q4_K_M (a k-quant: refused for models whose matrix rows are not
  multiples of 256 wide, which llama-quantize would silently store as q5_0/q8_0).
- load (model.py): llama-server's own tokenizer, greedy generation and log-probabilities; the reference is
  PyTorch on the merged checkpoint (release/backends/torch_reference.py).
- serving (runner.py, server.py): llama-server behind relctl's router, one slot per admitted request.
- its memory plan (plan.py): weights as the GGUF stores them, KV bytes per token from its header, one
  unified pool rounded to llama.cpp's 256-cell step, the micro-batch's compute buffer and the process; the
  memory gate, promote's memory stage and `relctl plan --engine llama-cpp` read it.
- its deployment (deploy.py, kserve-llama-cpp-inferenceservice.yaml): the ghcr.io/ggml-org/llama.cpp:server
  image running llama-server with the slots, KV pool and memory the release's plan recorded.
- `convert.llama-cpp` in release.yaml (LlamaCppSettings): the build's folder and llama-server's threads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from release.backends.base import (
    Backend,
    Deploy,
    Deployment,
    EngineMemory,
    ExportResult,
    Flavour,
    LoadedModel,
    LogprobSupport,
    MemoryFacts,
    ServerCommand,
    Support,
    architecture,
    unnamed_architecture,
)
from release.backends.llama_cpp import toolchain
from release.backends.llama_cpp.gguf_facts import DEFAULT_CACHE_TYPE, GGUF_FILE, read_gguf
from release.backends.llama_cpp.server import THREADS_ENV, server_argv
from release.core.errors import InputError

if TYPE_CHECKING:
    from release.backends.base import Runner
    from release.backends.planning import EnginePlan, Target
    from release.core.server_settings import ServerSettings

# Architectures whose conversion, validation and serving have been run here (the example is a Llama).
LLAMA_CPP_ARCHITECTURES = frozenset({"LlamaForCausalLM"})
# general.file_type (llama_ftype) of what export builds -> relctl's precision name.
FILE_TYPES = {1: "fp16", 7: "q8_0", 15: "q4_K_M"}
# llama-server's own default of concurrent sequences (`--parallel` auto: 4 slots on one unified KV pool):
# what it schedules itself, so relctl's server admits at least that many into it (admission_limit).
DEFAULT_SLOTS = 4


class LlamaCppSettings(BaseModel):
    """`convert.llama-cpp` in release.yaml: where this machine's llama.cpp build is and how it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: str | None = Field(None, description="the llama.cpp build's folder (relative to this file's folder); "
                                               "RELCTL_LLAMA_CPP_HOME overrides it; default: "
                                               "~/.cache/relctl/llama.cpp-0.3.36 (make llama-cpp-env)")
    threads: int | None = Field(None, ge=1, description="llama-server's --threads (default: llama.cpp's own); "
                                                        "RELCTL_LLAMA_CPP_THREADS overrides it")


class LlamaCppBackend(Backend):
    id = "llama-cpp"
    display_name = "llama.cpp"
    # auto: after onnxruntime-genai and vLLM, so adding this plug-in changes no release auto already makes.
    preference = 30
    distribution = "llama-cpp-python"
    precisions = ("fp16", "q8_0", "q4_K_M")
    execution_providers = ("cpu",)
    runtime_files = (GGUF_FILE,)
    families = "llama.cpp GGUF (" + ", ".join(sorted(a.removesuffix("ForCausalLM") for a in LLAMA_CPP_ARCHITECTURES)) \
        + "); q4_K_M needs matrix rows that are multiples of 256"
    reference_from_checkpoint = True
    settings_model = LlamaCppSettings
    # The package's config.json: the context each llama-server slot serves in a deployment.
    deploy_files = ("source/config.json",)
    # llama-server is its own process: its start time is reported through `plan(measure=True)`.
    cold_start_in_process = False
    # llama-server's /v1/completions refuses `echo` ("Only no echo is supported": no prompt log-probabilities,
    # ggml-org/llama.cpp#8942, #27174), so lm-eval's log-likelihood tasks cannot run on it; its generated-token
    # log-probabilities are not forwarded by relctl's runner either.
    logprobs = LogprobSupport(why_not="llama-server computes no prompt log-probabilities (its completions endpoint "
                                      "refuses echo), and relctl does not forward its generated-token ones")

    def supports(self, config: dict[str, Any]) -> Support:
        arch = architecture(config)
        if not arch:
            return unnamed_architecture(config)
        if arch not in LLAMA_CPP_ARCHITECTURES:
            return Support.no(arch, f"{arch} has not been converted and validated through llama.cpp here")
        return Support.yes(arch)

    def target_problem(self, precision: str, execution_provider: str, check_env: bool = True) -> str | None:
        problem = super().target_problem(precision, execution_provider)
        if problem is None and check_env:
            # Found by `relctl check` and promote's first step, not after the reference stage.
            missing = toolchain.missing()
            if missing is not None:
                return f"{missing} ({toolchain.MAKE_HINT})"
        return problem

    def version(self) -> str:
        built = toolchain.build_record() is not None
        return toolchain.LLAMA_CPP_PYTHON_VERSION + ("" if built else " (not built: make llama-cpp-env)")

    # -- building and loading --------------------------------------------------------------------
    def export(self, checkpoint: Path, out: Path, precision: str, execution_provider: str,
               log_path: Path) -> ExportResult:
        import torch  # noqa: PLC0415 - the converter runs on relctl's torch and transformers
        import transformers  # noqa: PLC0415

        from release.backends.llama_cpp.export import export_gguf  # noqa: PLC0415

        notes = export_gguf(checkpoint, out, precision, log_path)
        return ExportResult(versions={"llama.cpp": f"vendored in llama-cpp-python {toolchain.LLAMA_CPP_PYTHON_VERSION}",
                                      "gguf": str(getattr(toolchain.gguf_module(), "__version__", "0.19.0")),
                                      "torch": torch.__version__, "transformers": transformers.__version__},
                            notes=notes)

    def load(self, model_dir: Path, execution_provider: str = "cpu") -> LoadedModel:
        from release.backends.llama_cpp.model import served_model  # noqa: PLC0415 - starts a server

        return served_model(self, model_dir)

    def load_reference(self, model_dir: Path) -> LoadedModel:
        from release.backends.streamed_reference import load_checkpoint_reference  # noqa: PLC0415 - loads torch

        reference: LoadedModel = load_checkpoint_reference(model_dir)
        return reference

    def precision_of(self, model_dir: Path) -> str:
        file_type = read_gguf(model_dir / GGUF_FILE).file_type
        return FILE_TYPES.get(file_type, f"file_type {file_type}")

    def runtime_config(self, model_dir: Path) -> dict[str, Any]:
        # What llama-server is started with is part of the serving config every response names.
        return {"engine": "llama.cpp", "llama_cpp_python": toolchain.LLAMA_CPP_PYTHON_VERSION,
                "precision": self.precision_of(model_dir), "cache_type": DEFAULT_CACHE_TYPE}

    def memory_facts(self, model_dir: Path, declared_precision: str | None) -> MemoryFacts:
        facts = read_gguf(model_dir / GGUF_FILE)
        precision = declared_precision or FILE_TYPES.get(facts.file_type, "fp16")
        return MemoryFacts(weights_bytes=facts.weights_bytes, kv_dtype_bytes=2, precision=precision, provider="cpu")

    def configure(self, settings: BaseModel, base_dir: Path, label: str) -> None:
        assert isinstance(settings, LlamaCppSettings)
        if settings.home is not None:
            toolchain.configure_home(settings.home, base_dir, label)
        if settings.threads is not None and not os.environ.get(THREADS_ENV):
            os.environ[THREADS_ENV] = str(settings.threads)  # the serve processes the gates start read it too

    def plan(self, source: Path, target: Target, precision: str | None = None,
             settings: dict[str, Any] | None = None, measure: bool = False,
             overlap_bytes: int | None = None) -> EnginePlan:
        """llama.cpp's allocation (release/backends/llama_cpp/plan.py). `measure`: the KV pool llama-server
        logged for the package (the validation server the gates share) against the same arithmetic."""
        from release.backends.llama_cpp.plan import load_spec, make_plan  # noqa: PLC0415 - reads packages

        if settings:
            raise InputError(f"{next(iter(settings))}: the {self.id} plan takes no engine options",
                             hint="drop the option (relctl plan --help lists each engine's)")
        if target.provider not in self.execution_providers:
            raise InputError(f"--provider {target.provider}: the {self.id} backend builds and serves on "
                             f"{', '.join(self.execution_providers)} only", hint="plan it with --provider cpu")
        spec = load_spec(source, precision, target, self.precisions)
        model_dir = source / "model" if (source / "model").is_dir() else source
        reported = None
        if measure and spec.source == "package":
            reported = self.engine_memory(model_dir)
        slots = max(1, int(reported.max_concurrency)) if reported is not None else 1
        return make_plan(self.id, spec, target, overlap_bytes, reported, slots)

    def engine_memory(self, model_dir: Path) -> EngineMemory:
        """llama-server's own KV cache line for the folder, from the server validation and the gates share."""
        from release.backends.llama_cpp.memory import engine_memory  # noqa: PLC0415 - starts a server
        from release.backends.llama_cpp.model import served_model  # noqa: PLC0415

        return engine_memory(served_model(self, model_dir).server)

    # -- serving -----------------------------------------------------------------------------------
    def adapter_problem(self, precision: str) -> str | None:
        # llama.cpp applies LoRA GGUF files at run time (--lora, /lora-adapters), but the PEFT-to-GGUF converter
        # (convert_lora_to_gguf.py) is not part of the installed llama.cpp tools: not built here yet.
        return ("llama.cpp serves LoRA as GGUF files (--lora), but relctl does not convert PEFT adapters to "
                "GGUF yet")

    def open_runner(self, model_dir: Path, settings: ServerSettings) -> Runner:
        from release.backends.llama_cpp.runner import LlamaCppRunner  # noqa: PLC0415 - starts a server

        return LlamaCppRunner.start(self, model_dir, settings)

    def engine_command(self, model_dir: Path, served_name: str, host: str, port: int, slots: int) -> ServerCommand:
        """llama-server for `model_dir` with `slots` sequences at the model's full context each."""
        context = read_gguf(model_dir / GGUF_FILE).context_length
        argv = server_argv(toolchain.binary("llama-server"), model_dir / GGUF_FILE, served_name, host, port, slots,
                           context)
        # Verbosity 4 (trace) logs the KV pool llama.cpp allocated ("llama_kv_cache: size = ..."), which
        # engine_memory reads back; the default (3) does not print it.
        argv += ["--log-verbosity", "4"]
        return ServerCommand(argv=argv, env={}, health_path="/health")

    def server_command(self, model_dir: Path, served_name: str, host: str, port: int,
                       settings: ServerSettings) -> ServerCommand:
        return self.engine_command(model_dir, served_name, host, port, settings.workers)

    def admission_limit(self, settings: ServerSettings) -> int | None:
        return DEFAULT_SLOTS  # llama-server schedules its slots itself: relctl admits at least that many

    # -- registry and deployment -------------------------------------------------------------------
    def flavour(self) -> Flavour:
        # The sdist whose vendored llama.cpp builds the tools that made and serve the file.
        return Flavour("files", pip_requirements=(f"llama-cpp-python=={toolchain.LLAMA_CPP_PYTHON_VERSION}",))

    def deploy(self) -> Deploy:
        from release.backends.llama_cpp.deploy import IMAGE, TEMPLATE  # noqa: PLC0415

        # llama.cpp's image is published: no Dockerfile of relctl's builds it.
        return Deploy(image=IMAGE, dockerfile="", requirements=(), kserve_template=str(TEMPLATE))

    def deployment(self, files: dict[str, dict[str, Any]], memory: dict[str, float],
                   device: str | None = None) -> Deployment:
        """llama.cpp's own image runs llama-server on the GGUF with the slots and KV pool of the release's plan,
        validated on cpu (the only provider this backend builds for); the CUDA image on --gpus."""
        from release.backends.llama_cpp.deploy import deployment  # noqa: PLC0415

        return deployment(files, memory, device)
