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
- facts for the plan and a deployment (gguf_facts.py, deploy.py): KV bytes per token from the GGUF's own
  header, weights as stored, the ghcr.io/ggml-org/llama.cpp:server container and its args.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.backends.base import (
    Backend,
    Deploy,
    EngineMemory,
    ExportResult,
    Flavour,
    LoadedModel,
    MemoryFacts,
    ServerCommand,
    Support,
    architecture,
    unnamed_architecture,
)
from release.backends.llama_cpp import toolchain
from release.backends.llama_cpp.gguf_facts import DEFAULT_CACHE_TYPE, GGUF_FILE, read_gguf
from release.backends.llama_cpp.server import server_argv

if TYPE_CHECKING:
    from release.backends.base import Runner
    from release.core.server_settings import ServerSettings

# Architectures whose conversion, validation and serving have been run here (the example is a Llama).
LLAMA_CPP_ARCHITECTURES = frozenset({"LlamaForCausalLM"})
# general.file_type (llama_ftype) of what export builds -> relctl's precision name.
FILE_TYPES = {1: "fp16", 7: "q8_0", 15: "q4_K_M"}
# The memory plan's coarse precision classes (release/memory/shape.py's Precision) for each GGUF type.
PLAN_PRECISIONS = {"fp16": "fp16", "q8_0": "int8", "q4_K_M": "int4"}


class LlamaCppBackend(Backend):
    id = "llama-cpp"
    distribution = "llama-cpp-python"
    precisions = ("fp16", "q8_0", "q4_K_M")
    execution_providers = ("cpu",)
    runtime_files = (GGUF_FILE,)
    families = "llama.cpp GGUF (" + ", ".join(sorted(a.removesuffix("ForCausalLM") for a in LLAMA_CPP_ARCHITECTURES)) \
        + "); q4_K_M needs matrix rows that are multiples of 256"
    reference_from_checkpoint = True

    def supports(self, config: dict[str, Any]) -> Support:
        arch = architecture(config)
        if not arch:
            return unnamed_architecture(config)
        if arch not in LLAMA_CPP_ARCHITECTURES:
            return Support.no(arch, f"{arch} has not been converted and validated through llama.cpp here")
        return Support.yes(arch)

    def target_problem(self, precision: str, execution_provider: str) -> str | None:
        problem = super().target_problem(precision, execution_provider)
        if problem is None:
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
        from release.backends.torch_reference import TorchReference  # noqa: PLC0415 - loads torch

        return TorchReference(model_dir)

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
        return MemoryFacts(weights_bytes=facts.weights_bytes, kv_dtype_bytes=2,
                           precision=PLAN_PRECISIONS.get(precision, "fp16"), provider="cpu")

    def engine_memory(self, model_dir: Path) -> EngineMemory:
        """llama-server's own KV cache line for the folder, from the server validation and the gates share."""
        from release.backends.llama_cpp.memory import engine_memory  # noqa: PLC0415 - starts a server
        from release.backends.llama_cpp.model import served_model  # noqa: PLC0415

        return engine_memory(served_model(self, model_dir).server)

    # -- serving -----------------------------------------------------------------------------------
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

    # -- registry and deployment -------------------------------------------------------------------
    def flavour(self) -> Flavour:
        # The sdist whose vendored llama.cpp builds the tools that made and serve the file.
        return Flavour("files", pip_requirements=(f"llama-cpp-python=={toolchain.LLAMA_CPP_PYTHON_VERSION}",))

    def deploy(self) -> Deploy:
        from release.backends.llama_cpp.deploy import IMAGE  # noqa: PLC0415

        return Deploy(image=IMAGE, dockerfile="", requirements=())
