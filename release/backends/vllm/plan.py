"""vLLM's memory plan of one replica: weights, then paged KV blocks in what is left of
gpu_memory_utilization, as vLLM 0.32.0 sizes them at start-up (read from its source, cited per figure).

vLLM does not size its KV cache for a load; it takes a share of the device and fills the rest with blocks
(vllm/v1/worker/gpu_worker.py determine_available_memory, vllm/v1/core/kv_cache_utils.py):
    budget        = devices x memory x gpu_memory_utilization         (0.92 by default: CacheConfig)
    non-KV        = weights + activations + CUDA graphs + overhead    (per device; weights sharded)
    KV pool       = budget - non-KV; or an explicit size: VLLM_CPU_KVCACHE_SPACE GiB on CPU (relctl starts
                    vLLM with RELCTL_VLLM_KVCACHE_GIB, default 1), --kv-cache-memory-bytes on GPU
    page          = block_size x KV bytes per token of every layer     (block 16 on GPU, 128 on CPU)
    blocks        = KV pool // page;  capacity = blocks x block_size tokens
    concurrency   = blocks / ceil(L / block_size)  at L tokens per request (vLLM logs it at max_model_len:
                    "<GPU|CPU> KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx")
The load fits when B sequences of L tokens fit in the blocks (B x ceil(L/block) <= blocks), B is within
max_num_seqs, and the KV pool is not negative (the weights and activations leave room for a block at all).

Figures the formula takes from elsewhere, each stated:
- KV bytes per token: plan.kv_bytes_per_token (K and V per KV head, or MLA's latent; release/memory/shape.py).
  Every sliding layer is bounded in vLLM (SlidingWindowSpec: min(window - 1 + max_num_batched_tokens, L)
  tokens, plus one block), Mistral's too: unlike onnxruntime-genai, which bounds only layer_types' sliding
  layers. Models mixing sliding and full layers are summed per layer (vLLM's hybrid allocator pads groups
  to equal sizes; the figure is then within a group's padding).
- Activations: vLLM's profile run is one forward of max_num_batched_tokens tokens (chunked prefill: a long
  prompt is prefilled in chunks of that budget, never whole) plus the sampler over max_num_seqs rows of
  logits: plan.hidden_activation_bytes(T) + min(max_num_seqs, T) x vocab x (dtype + 4 bytes of fp32 logits).
- CUDA graphs: an explicit allowance (CUDA_GRAPH_ALLOWANCE_BYTES), not measured here: vLLM profiles the
  graphs' memory at start-up (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS) and takes it from the KV pool;
  none on CPU (vLLM's CPU platform captures no graphs).
- Overhead: the CUDA context and libraries' handles (CUDA_OVERHEAD_BYTES, stated); on CPU the three
  processes vLLM runs (API server, engine core, worker) with torch imported (VLLM_CPU_PROCESS_BYTES, measured).
On GPU, 1 - gpu_memory_utilization is the memory the plan leaves free (target.headroom is not applied); on
CPU, where vLLM's pool is explicit, the replica must fit within memory x (1 - headroom).

Rollout: by default a new replica starts on its own devices (a Kubernetes surge), so the rollout needs
twice the devices for its duration and no memory is shared. Same-device overlap is an option: vLLM requests
its utilization share of the device's free memory, so the old replica's footprint must leave that free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from release.backends.planning import (
    GIB,
    KV_DTYPE_BYTES,
    Target,
    check_context,
    hidden_activation_bytes,
    kv_bytes_per_token,
    largest,
)
from release.backends.shape import ModelShape, parameter_count
from release.core.errors import InputError
from release.core.units import size

ENGINE = "vllm"
VllmPrecision = Literal["fp32", "fp16", "bf16"]
VLLM_PRECISIONS: tuple[VllmPrecision, ...] = ("fp32", "fp16", "bf16")
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
# vllm/config/cache.py: CacheConfig.gpu_memory_utilization default (0.92 in vLLM 0.32.0; 0.9 before).
GPU_MEMORY_UTILIZATION = 0.92
# vllm/config/cache.py DEFAULT_BLOCK_SIZE = 16; vllm/platforms/cpu.py sets 128 unless the user gives one.
BLOCK_SIZE: dict[str, int] = {"cuda": 16, "cpu": 128}
# Stated (module docstring): not measured on this machine, which has no GPU.
CUDA_GRAPH_ALLOWANCE_BYTES: dict[str, int] = {"cuda": 1 * GIB, "cpu": 0}
# Measured: vLLM 0.32.0 serving the e2e example on CPU held 3,088,420,864 B of RSS summed over its processes
# (shared pages counted in each), 1.85 GiB beyond its weights and its 1 GiB pool; rounded up.
VLLM_CPU_PROCESS_BYTES = 2 * GIB
# The CUDA context and cuBLAS/cuDNN handles of the worker: stated, not measured here (no GPU).
CUDA_OVERHEAD_BYTES = 768 * 1024**2


def default_batch_limits(provider: str, memory_gib: float, gpu_name: str | None) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's OpenAI server picks (vllm/engine/arg_utils.py
    get_batch_defaults): CPU 2048 / 128; >= 160 GiB 16384 / 1024; >= 70 GiB and not an A100 8192 / 1024;
    else 2048 / 256."""
    if provider == "cpu":
        return 2048, 128
    if memory_gib * GIB >= 160 * GIB:
        return 16384, 1024
    if memory_gib >= 70 and "a100" not in (gpu_name or "").lower():
        return 8192, 1024
    return 2048, 256


@dataclass(frozen=True)
class VllmSettings:
    """How vLLM is started: its memory share, block size, scheduler budget and explicit KV size."""

    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    block_size: int | None = None              # None: 16 on GPU, 128 on CPU
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the device
    max_num_seqs: int | None = None            # None: vLLM's default for the device
    kv_cache_bytes: int | None = None          # explicit KV pool (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes)
    max_model_len: int | None = None           # None: max_position_embeddings (what relctl starts vLLM with)

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InputError(f"--gpu-memory-utilization: {self.gpu_memory_utilization} is not in (0, 1]",
                             hint=f"vLLM's default is {GPU_MEMORY_UTILIZATION}")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "kv_cache_bytes", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')}: {value} is not positive", hint="give 1 or more")


@dataclass(frozen=True)
class VllmSpec:
    """The model vLLM would hold: its shape, dtype and weight bytes (the package's safetensors, or config)."""

    shape: ModelShape
    precision: VllmPrecision
    weights_bytes: int
    weights_source: Literal["package", "config"]

    @classmethod
    def from_config(cls, shape: ModelShape, precision: VllmPrecision) -> VllmSpec:
        """Every parameter at the dtype, plus the rotary cos/sin cache vLLM keeps as a buffer."""
        dtype = DTYPE_BYTES[precision]
        rope = shape.max_positions * (shape.rotary_dim or shape.head_dim) * dtype
        return cls(shape, precision, parameter_count(shape) * dtype + rope, "config")


def check_precision(precision: str, provider: str) -> VllmPrecision:
    """A dtype vLLM runs on `provider` (its CPU build here serves fp32 and bf16: release/backends/vllm)."""
    if precision not in VLLM_PRECISIONS:
        raise InputError(f"--precision: vLLM plans {', '.join(VLLM_PRECISIONS)}, not {precision}",
                         hint="quantized vLLM formats are not planned yet; plan fp16 or bf16")
    if provider == "cpu" and precision == "fp16":
        raise InputError("--precision: vLLM's CPU build here serves fp32 and bf16, not fp16",
                         hint="plan fp32 or bf16 on cpu, or fp16 with --gpu")
    return precision  # narrowed by the membership test above


@dataclass(frozen=True)
class VllmBreakdown:
    """One vLLM replica on the target; sizes in bytes, all devices together."""

    weights: int
    activations: int
    cuda_graphs: int
    overhead: int
    budget: int              # what vLLM may take: capacity x utilization (CPU: capacity x (1 - headroom))
    kv_pool: int             # the blocks' memory (negative: the weights do not leave room)
    kv_needed: int           # the load's blocks: concurrency x blocks per request x page bytes
    kv_bytes_per_token: int
    block_size: int
    page_bytes: int          # one block of every layer
    num_blocks: int
    blocks_per_request: int  # at the target context
    kv_capacity_tokens: int  # num_blocks x block_size
    max_concurrency: float   # num_blocks / blocks per request at the target context
    overlap: int             # the old replica on the same devices (0 in a surge rollout)
    capacity: int
    fits: bool
    reasons: tuple[str, ...]

    @property
    def non_kv(self) -> int:
        return self.weights + self.activations + self.cuda_graphs + self.overhead

    @property
    def peak(self) -> int:
        """What the replica holds: vLLM takes its whole pool at start-up, whatever the load."""
        return self.non_kv + max(self.kv_pool, 0) + self.overlap

    @property
    def kv_headroom(self) -> int:
        """KV memory left over at the planned load (the pool beyond the load's blocks)."""
        return self.kv_pool - self.kv_needed

    @property
    def headroom_bytes(self) -> int:
        """The device memory the plan leaves: the KV pool's spare blocks plus what vLLM does not take."""
        return self.capacity - self.non_kv - self.kv_needed - self.overlap

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = asdict(self)
        data["reasons"] = list(self.reasons)
        data.update(non_kv=self.non_kv, peak=self.peak, kv_headroom=self.kv_headroom,
                    headroom_bytes=self.headroom_bytes, max_concurrency=round(self.max_concurrency, 2))
        data["gib"] = {k: round(v / GIB, 3) for k, v in data.items() if k in _SIZES}
        return data


_SIZES = ("weights", "activations", "cuda_graphs", "overhead", "budget", "kv_pool", "kv_needed", "overlap",
          "capacity", "non_kv", "peak", "kv_headroom", "headroom_bytes", "page_bytes")


def kv_dtype_bytes(spec: VllmSpec, target: Target) -> int:
    """The KV cache dtype: --kv-dtype (vLLM's --kv-cache-dtype, e.g. fp8), else the model's ('auto')."""
    return KV_DTYPE_BYTES[target.kv_dtype] if target.kv_dtype else DTYPE_BYTES[spec.precision]


def blocks_per_request(shape: ModelShape, kv_bytes: int, context: int, block: int, batched: int) -> tuple[int, int]:
    """(layer-blocks one request of `context` tokens holds, per-layer page bytes): full layers
    ceil(L / block) each, sliding ones ceil(min(window - 1 + batched, L) / block) + 1 (SlidingWindowSpec)."""
    layer_page = block * shape.kv_elements_per_layer * kv_bytes
    full = math.ceil(context / block)
    sliding = shape.sliding_layers if shape.sliding_window else 0
    bounded = math.ceil(min(shape.sliding_window - 1 + batched, context) / block) + 1 if sliding else 0
    return (shape.layers - sliding) * full + sliding * bounded, layer_page


def activation_bytes(spec: VllmSpec, batched: int, seqs: int) -> int:
    """vLLM's profile run: one forward of `batched` tokens and the sampler's fp32 logits of `seqs` rows."""
    dtype = DTYPE_BYTES[spec.precision]
    sampled = min(seqs, batched)
    return hidden_activation_bytes(spec.shape, batched, dtype) + sampled * spec.shape.vocab * (dtype + 4)


@dataclass(frozen=True)
class Resolved:
    """The settings with vLLM's defaults filled in for the target."""

    block_size: int
    batched: int
    seqs: int
    max_model_len: int


def resolve(spec: VllmSpec, target: Target, settings: VllmSettings) -> Resolved:
    batched, seqs = default_batch_limits(target.provider, target.memory_gib, target.gpu_name)
    model_len = settings.max_model_len or spec.shape.max_positions
    seqs = settings.max_num_seqs or seqs
    # arg_utils: the default budget never exceeds max_num_seqs x max_model_len.
    batched = settings.max_num_batched_tokens or min(batched, seqs * model_len)
    return Resolved(settings.block_size or BLOCK_SIZE[target.provider], batched, seqs, model_len)


def breakdown(spec: VllmSpec, target: Target, settings: VllmSettings,
              overlap_bytes: int | None = None) -> VllmBreakdown:
    """The vLLM plan of `spec` on `target`; `overlap_bytes`: the old replica's footprint on the same devices
    when target.rollout_overlap (None: the same as this one)."""
    r = resolve(spec, target, settings)
    kv_bytes = kv_dtype_bytes(spec, target)
    per_request, layer_page = blocks_per_request(spec.shape, kv_bytes, target.context, r.block_size, r.batched)
    page = layer_page * spec.shape.layers
    gpus = target.gpus
    activations = activation_bytes(spec, r.batched, r.seqs) * gpus
    graphs = CUDA_GRAPH_ALLOWANCE_BYTES[target.provider] * gpus
    overhead = (CUDA_OVERHEAD_BYTES if target.provider == "cuda" else VLLM_CPU_PROCESS_BYTES) * gpus
    non_kv = spec.weights_bytes + activations + graphs + overhead
    capacity = target.capacity_bytes
    if target.provider == "cpu":
        budget = int(capacity * (1 - target.headroom))
    else:
        budget = int(capacity * settings.gpu_memory_utilization)
    pool = settings.kv_cache_bytes if settings.kv_cache_bytes is not None else budget - non_kv
    # Every layer's page together: a request's layer-blocks over all layers, in whole-model blocks.
    num_blocks = max(pool, 0) // page
    request_blocks = per_request / spec.shape.layers
    concurrency = num_blocks / request_blocks if request_blocks else 0.0
    needed = target.concurrency * per_request * layer_page
    held = spec.weights_bytes + activations + graphs + overhead + max(pool, 0)
    overlap = 0
    if target.rollout_overlap:
        overlap = held if overlap_bytes is None else overlap_bytes
    reasons = []
    if pool <= 0 or num_blocks == 0:
        reasons.append(f"no room for a KV block: the non-KV memory {size(non_kv)} fills the budget {size(budget)}")
    elif needed > pool:
        reasons.append(f"{target.concurrency} x {target.context:,} tokens need {size(needed)} of KV, the pool holds "
                       f"{size(pool)} ({concurrency:.2f} requests at {target.context:,} tokens)")
    if target.concurrency > r.seqs:
        reasons.append(f"concurrency {target.concurrency} is above max_num_seqs {r.seqs}")
    if target.provider == "cpu" or settings.kv_cache_bytes is not None:
        # An explicit pool is taken as given; the process must still fit the host (vLLM refuses a pool
        # larger than the free memory).
        if held + overlap > (budget if target.provider == "cpu" else capacity):
            reasons.append(f"weights, activations and the {size(pool)} KV pool ({size(held)}"
                           + (f" + {size(overlap)} old replica" if overlap else "") + f") exceed {size(budget)}")
    elif overlap and capacity - overlap < budget:
        reasons.append(f"same-device rollout: the old replica holds {size(overlap)}, vLLM requests "
                       f"{settings.gpu_memory_utilization:g} x the device ({size(budget)}) of what is free "
                       f"({size(capacity - overlap)}); lower gpu_memory_utilization or roll out on new devices")
    return VllmBreakdown(
        weights=spec.weights_bytes, activations=activations, cuda_graphs=graphs, overhead=overhead, budget=budget,
        kv_pool=pool, kv_needed=needed, kv_bytes_per_token=kv_bytes_per_token(spec.shape, kv_bytes),
        block_size=r.block_size, page_bytes=page, num_blocks=num_blocks,
        blocks_per_request=math.ceil(request_blocks), kv_capacity_tokens=num_blocks * r.block_size,
        max_concurrency=concurrency, overlap=overlap, capacity=capacity, fits=not reasons, reasons=tuple(reasons))


def reported_capacity(spec: VllmSpec, target: Target, settings: VllmSettings) -> tuple[int, float]:
    """(tokens, concurrency) exactly as vLLM logs them at start-up, at its max_model_len
    (kv_cache_utils.get_kv_cache_capacity: int(concurrency x max_model_len))."""
    r = resolve(spec, target, settings)
    at_len = breakdown(spec, replace(target, context=r.max_model_len, concurrency=1, rollout_overlap=False), settings)
    return int(at_len.max_concurrency * r.max_model_len), at_len.max_concurrency


@dataclass(frozen=True)
class VllmPlan:
    spec: VllmSpec
    target: Target
    settings: VllmSettings
    breakdown: VllmBreakdown
    max_concurrency: int
    max_context: int
    gpus_needed: int | None
    reported_tokens: int          # "KV cache size: N tokens" as vLLM logs it
    reported_concurrency: float   # "Maximum concurrency for max_model_len tokens per request: X"
    max_model_len: int
    batched_tokens: int
    max_num_seqs: int

    engine = ENGINE

    @property
    def fits(self) -> bool:
        return self.breakdown.fits

    @property
    def rollout_gpus(self) -> int:
        """Devices held during a rollout: a surge doubles them; same-device overlap keeps them."""
        return self.target.gpus if self.target.rollout_overlap else 2 * self.target.gpus

    def log_line(self) -> str:
        """The start-up line vLLM would print for this plan (kv_cache_utils.update_kv_cache_capacity)."""
        pools = "GPU" if self.target.provider == "cuda" else "CPU"
        return (f"{pools} KV cache size: {self.reported_tokens:,} tokens, Maximum concurrency for "
                f"{self.max_model_len:,} tokens per request: {self.reported_concurrency:.2f}x")

    def summary(self) -> str:
        t, b = self.target, self.breakdown
        device = f"{t.gpus} x {t.gpu_name or f'{t.memory_gib:g} GiB'}"
        load = f"{t.concurrency} x {t.context:,} tokens"
        if self.fits:
            return (f"fits on vLLM: {load} need {size(b.kv_needed)} of KV, the pool holds {size(b.kv_pool)} "
                    f"({b.kv_capacity_tokens:,} tokens, {b.max_concurrency:.2f} requests at {t.context:,}); "
                    f"headroom {size(b.kv_headroom)} of KV, {size(b.headroom_bytes)} of {device}; "
                    f"rollout needs {self.rollout_gpus} x {t.gpu_name or 'devices'}")
        gpus = f"; {self.gpus_needed} x {t.gpu_name or 'devices'} would fit" if self.gpus_needed else ""
        return (f"does not fit on vLLM: {'; '.join(b.reasons)}; largest concurrency at {t.context:,} tokens: "
                f"{self.max_concurrency}; largest context at {t.concurrency} sequences: {self.max_context:,}{gpus}")

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {
            "engine": ENGINE,
            "fits": self.fits,
            "summary": self.summary(),
            "model": {**self.spec.shape.to_dict(), "parameters": parameter_count(self.spec.shape),
                      "precision": self.spec.precision, "weights_source": self.spec.weights_source},
            "target": {"gpu": t.gpu_name, "memory_gib": t.memory_gib, "gpus": t.gpus, "provider": t.provider,
                       "concurrency": t.concurrency, "context": t.context, "kv_dtype": t.kv_dtype,
                       "headroom": t.headroom, "rollout_overlap": t.rollout_overlap},
            "vllm": {"gpu_memory_utilization": self.settings.gpu_memory_utilization,
                     "block_size": self.breakdown.block_size, "max_num_batched_tokens": self.batched_tokens,
                     "max_num_seqs": self.max_num_seqs, "max_model_len": self.max_model_len,
                     "kv_cache_bytes": self.settings.kv_cache_bytes},
            "breakdown": self.breakdown.to_dict(),
            "kv_capacity_tokens": self.breakdown.kv_capacity_tokens,
            "reported": {"kv_cache_tokens": self.reported_tokens,
                         "max_concurrency": round(self.reported_concurrency, 2),
                         "max_model_len": self.max_model_len, "log_line": self.log_line()},
            "max_concurrency": self.max_concurrency,
            "max_context": self.max_context,
            "gpus_needed": self.gpus_needed,
            "rollout": {"kind": "same devices" if t.rollout_overlap else "surge (a new replica on its own devices)",
                        "gpus_during_rollout": self.rollout_gpus},
        }


def make_plan(spec: VllmSpec, target: Target, settings: VllmSettings | None = None,
              overlap_bytes: int | None = None) -> VllmPlan:
    """Everything `relctl plan --engine vllm` and the memory gate report for `spec` on `target`."""
    settings = settings or VllmSettings()
    check_context(spec.shape, target.context, target.context_setting)
    r = resolve(spec, target, settings)
    if target.context > r.max_model_len:
        raise InputError(f"{target.context_setting}: {target.context} tokens is beyond vLLM's max_model_len "
                         f"{r.max_model_len}", hint=f"set {target.context_setting} to {r.max_model_len} or less, or "
                                                    "start vLLM with a longer --max-model-len")
    b = breakdown(spec, target, settings, overlap_bytes)

    def fits(**changes: Any) -> bool:
        return breakdown(spec, replace(target, **changes), settings, overlap_bytes).fits

    gpus = next((n for n in range(1, 65) if fits(gpus=n)), None)
    tokens, concurrency = reported_capacity(spec, target, settings)
    return VllmPlan(spec=spec, target=target, settings=settings, breakdown=b,
                    max_concurrency=largest(lambda n: fits(concurrency=n)),
                    max_context=largest(lambda n: fits(context=n), limit=r.max_model_len), gpus_needed=gpus,
                    reported_tokens=tokens, reported_concurrency=concurrency, max_model_len=r.max_model_len,
                    batched_tokens=r.batched, max_num_seqs=r.seqs)


def load_spec(path: Path, precision: str | None, provider: str) -> VllmSpec:
    """A vLLM package (weights: its safetensors bytes), another engine's package (weights from its
    config.json at the precision) or a config.json. Default precision: the package's, else fp16 on GPU and
    fp32 on CPU."""
    from release.backends.package_facts import read_config_file, read_package  # noqa: PLC0415 - entry points
    from release.backends.shape import shape_from_config  # noqa: PLC0415

    if path.is_file():
        shape = shape_from_config(read_config_file(path), path.name)
        chosen = check_precision(precision or ("fp16" if provider == "cuda" else "fp32"), provider)
        return VllmSpec.from_config(shape, chosen)
    facts = read_package(path)
    shape = shape_from_config(facts.config, f"{path.name}: config.json")
    own = facts.backend == ENGINE and precision in (None, facts.precision)
    if own:
        return VllmSpec(shape, check_precision(facts.precision, provider), facts.weights_bytes, "package")
    default = facts.precision if facts.precision in VLLM_PRECISIONS else "fp16" if provider == "cuda" else "fp32"
    return VllmSpec.from_config(shape, check_precision(precision or default, provider))


def plan_lines(plan: VllmPlan) -> list[str]:
    """The plan as `relctl plan` prints it."""
    lines: list[str] = []
    b, t, s = plan.breakdown, plan.target, plan.spec
    source = "the package" if s.weights_source == "package" else "config.json"
    device = t.gpu_name or f"{t.memory_gib:g} GiB"
    share = (f"gpu_memory_utilization {plan.settings.gpu_memory_utilization:g}" if plan.settings.kv_cache_bytes is None
             else f"explicit KV pool {size(plan.settings.kv_cache_bytes)}")
    lines.append(f"vLLM: {s.precision} weights from {source}, {t.concurrency} x {t.context:,} tokens on {t.gpus} x "
               f"{device} ({share})")
    params = parameter_count(plan.spec.shape)
    lines.append(f"  {s.shape.family}, {params:,} parameters; KV {b.kv_bytes_per_token:,} bytes/token"
               f"{' (MLA latent)' if s.shape.mla else ''}; blocks of {b.block_size} tokens "
               f"({b.page_bytes:,} bytes); chunked prefill {plan.batched_tokens:,} tokens, "
               f"max_num_seqs {plan.max_num_seqs}")
    rows = (("weights", b.weights), ("activations", b.activations), ("CUDA graphs", b.cuda_graphs),
            ("overhead", b.overhead), ("KV pool", b.kv_pool), ("KV needed", b.kv_needed),
            ("KV headroom", b.kv_headroom), ("rollout overlap", b.overlap), ("budget", b.budget),
            ("capacity", b.capacity), ("headroom", b.headroom_bytes))
    for label, value in rows:
        lines.append(f"  {label:16s}{size(value, width=9)}")
    lines.append(f"  as vLLM logs it: {plan.log_line()}")
    lines.append(("✓ " if plan.fits else "✗ ") + plan.summary())
    lines.append("  note: CUDA graphs are a stated allowance (vLLM profiles them at start-up)"
               if t.provider == "cuda" else "  note: on CPU the KV pool is VLLM_CPU_KVCACHE_SPACE, taken whole")
    return lines
