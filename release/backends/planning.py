"""The memory plan's contract: where a replica serves (`Target`), what every engine's plan reports
(`EnginePlan`), and the engine-agnostic arithmetic each engine's plan builds on (KV bytes per token and per
sequence of a model shape, the hidden states of one forward pass, a monotone search).

Each backend computes its own plan (`Backend.plan`): onnxruntime-genai's in
release/backends/onnxruntime_genai/plan.py, vLLM's in release/backends/vllm/plan.py. The memory gate,
promote's memory stage, `relctl plan`, the engines table and `relctl render kserve` read only the
`EnginePlan` fields below, so one engine's figures are never computed with another engine's formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from release.backends.shape import ModelShape, Provider
from release.core.errors import InputError

GIB = 1024**3
MIB = 1024**2
KV_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class Target:
    """Where and how the model serves: devices, load, KV dtype and the headroom the plan keeps free."""

    memory_gib: float
    concurrency: int
    context: int
    gpus: int = 1
    provider: Provider = "cuda"
    kv_dtype: str | None = None       # None: the model's own (the io dtype of its precision)
    prefill_tokens: int | None = None  # None: the whole context (a full-length prompt for every sequence)
    headroom: float = 0.10
    rollout_overlap: bool = True
    gpu_name: str | None = None
    price_per_hour: float | None = None
    context_setting: str = "--context"  # what the user changes to plan another context (a flag or a yaml key)

    def __post_init__(self) -> None:
        for name in ("concurrency", "context", "gpus"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"--{name}: {value} is not a positive integer", hint=f"give --{name} of 1 or more")
        if not self.memory_gib > 0:
            raise InputError(f"memory: {self.memory_gib} GiB is not positive", hint="give a GPU name or a size > 0")
        if self.prefill_tokens is not None and self.prefill_tokens < 1:
            raise InputError(f"--prefill-tokens: {self.prefill_tokens} is not positive", hint="give 1 or more")
        if not 0 <= self.headroom < 1:
            raise InputError(f"headroom: {self.headroom} is not in [0, 1)", hint="0.10 keeps 10% free")
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPE_BYTES:
            raise InputError(f"--kv-dtype: '{self.kv_dtype}' is unknown",
                             hint=f"use one of {', '.join(KV_DTYPE_BYTES)}")

    @property
    def capacity_bytes(self) -> int:
        return int(self.memory_gib * GIB) * self.gpus


@dataclass(frozen=True)
class Check:
    """A judged number of a plan: `value` `op` `bound` (the memory gate records each as a threshold)."""

    name: str
    value: float
    op: Literal[">=", "<=", ">", "<"]
    bound: float
    passed: bool
    reason: str = ""  # why it failed, in words, when it did


@dataclass(frozen=True)
class EnginePlan:
    """One engine's memory plan of one replica on a target. Sizes in bytes, all devices of a replica together.

    `per_replica_bytes` is THE figure of one replica (what the engines table, the card, the release's
    `memory.per_replica_bytes` and a deployment's memory limit use); `peak_bytes` adds the replica being
    replaced when a rollout shares the devices."""

    engine: str
    fits: bool
    summary: str
    target: Target
    precision: str
    weights_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int                 # KV memory a replica holds (planned load, or the pool it takes whole)
    kv_capacity_tokens: int | None      # tokens that KV memory holds (None: sized per load, not pooled)
    activations_bytes: int
    overhead_bytes: int                 # the engine's own processes and runtime beyond the model
    per_replica_bytes: int
    peak_bytes: int
    budget_bytes: int
    capacity_bytes: int
    max_concurrency: int                # at the target's context
    max_context: int                    # at the target's concurrency
    rollout_devices: int                # devices held during a rollout (a surge doubles them)
    checks: tuple[Check, ...] = ()      # what the gate judges (the fit first, then any measured agreement)
    details: dict[str, Any] = field(default_factory=dict)   # the engine's own breakdown and evidence, as JSON
    native: Any = field(default=None, compare=False, repr=False)  # the engine's plan object (its evidence)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        figures = {name: getattr(self, name) for name in (
            "weights_bytes", "kv_bytes_per_token", "kv_cache_bytes", "kv_capacity_tokens", "activations_bytes",
            "overhead_bytes", "per_replica_bytes", "peak_bytes", "budget_bytes", "capacity_bytes", "headroom_bytes",
            "max_concurrency", "max_context", "rollout_devices")}
        # The engine's own breakdown first, then the contract's figures every reader relies on.
        return {**self.details, "engine": self.engine, "fits": self.fits, "summary": self.summary,
                "precision": self.precision, **figures, "checks": [vars(c) for c in self.checks]}

    def metrics(self) -> dict[str, float]:
        """The figures a release records as `memory.*` (what `relctl render kserve` sizes a replica from)."""
        out = {"per_replica_bytes": float(self.per_replica_bytes), "peak_bytes": float(self.peak_bytes),
               "weights_bytes": float(self.weights_bytes), "kv_cache_bytes": float(self.kv_cache_bytes),
               "overhead_bytes": float(self.overhead_bytes), "max_concurrency": float(self.max_concurrency)}
        if self.kv_capacity_tokens is not None:
            out["kv_capacity_tokens"] = float(self.kv_capacity_tokens)
        return out


def kv_bytes_per_token(shape: ModelShape, kv_bytes: int) -> int:
    """K and V for every layer, for one token of one sequence (while the context is within every window):
    2 x layers x kv_heads x head_dim x kv_bytes, or MLA's layers x (kv_lora_rank + qk_rope_head_dim) x kv_bytes."""
    return shape.layers * shape.kv_elements_per_layer * kv_bytes


def kv_bytes_per_token_beyond_window(shape: ModelShape, kv_bytes: int) -> int:
    """What one more token costs once the context is past the window: the layers whose cache is not bounded."""
    return (shape.layers - shape.window_cache_layers) * shape.kv_elements_per_layer * kv_bytes


def kv_bytes_per_sequence(shape: ModelShape, kv_bytes: int, context: int) -> int:
    """One sequence's KV cache at `context` tokens: a layer with a window-bounded cache keeps at most its window."""
    bounded = shape.window_cache_layers
    windowed = min(context, shape.sliding_window) if bounded else context
    return shape.kv_elements_per_layer * kv_bytes * ((shape.layers - bounded) * context + bounded * windowed)


def check_context(shape: ModelShape, context: int, setting: str = "--context") -> None:
    """InputError when `context` is beyond the positions the model was built for (max_position_embeddings);
    `setting` names what the user changes (a flag, or a release.yaml key)."""
    if context > shape.max_positions:
        raise InputError(f"{setting}: {context} tokens is beyond the model's max_position_embeddings "
                         f"{shape.max_positions}",
                         hint=f"set {setting} to {shape.max_positions} or less (the model cannot attend further)")


def hidden_activation_bytes(shape: ModelShape, tokens: int, act_bytes: int) -> int:
    """Hidden states of one forward pass over `tokens` tokens at the MLP (or attention) peak: residual, norm
    and skip-sum (3h); gate, up, their SiLU product and one I-wide tensor of slack (6I); or attention's
    q, k, v and output (3h + 2q + 2kv). Shared by every engine's plan (vLLM passes its chunked-prefill budget)."""
    s = shape
    return tokens * act_bytes * max(3 * s.hidden + 6 * s.mlp_width, 3 * s.hidden + 2 * s.q_dim + 2 * s.kv_dim)


def largest(fits: Callable[[int], bool], limit: int = 2**40) -> int:
    """The largest n in [0, limit] with fits(n), for a monotone predicate (0 when even 1 does not fit)."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def sized_per_load_plan(engine: str, shape: ModelShape, precision: str, weights_bytes: int, kv_dtype_bytes: int,
                        target: Target, overhead_bytes: int, activations_bytes: Callable[[int, int], int],
                        overlap_bytes: int | None = None) -> EnginePlan:
    """The plan of an engine that allocates each sequence's KV cache for its whole context (no paged pool):
    weights + concurrency x one sequence's KV + activations(concurrency, context) + overhead, the replica
    being replaced beside it when the rollout shares the devices. A simple engine's `Backend.plan` can be
    this one call; an engine with its own allocator (paged blocks, a pool taken whole) writes its own."""
    check_context(shape, target.context, target.context_setting)

    def replica(concurrency: int, context: int) -> tuple[int, int, int]:
        kv = kv_bytes_per_sequence(shape, kv_dtype_bytes, context) * concurrency
        active = activations_bytes(concurrency, context)
        return kv, active, weights_bytes + kv + active + overhead_bytes * target.gpus

    budget = int(target.capacity_bytes * (1 - target.headroom))

    def peak(concurrency: int, context: int) -> int:
        one = replica(concurrency, context)[2]
        return one + (0 if not target.rollout_overlap else one if overlap_bytes is None else overlap_bytes)

    kv, active, per_replica = replica(target.concurrency, target.context)
    top = peak(target.concurrency, target.context)
    fits = top <= budget
    most = largest(lambda n: peak(n, target.context) <= budget)
    longest = largest(lambda n: peak(target.concurrency, n) <= budget, limit=shape.max_positions)
    load = f"{target.concurrency} x {target.context:,} tokens"
    summary = (f"{'fits' if fits else 'does not fit'} on {engine}: {precision} at {load} needs {top / GIB:.3f} GiB, "
               f"budget {budget / GIB:.3f} GiB; largest concurrency at {target.context:,} tokens: {most}; "
               f"largest context at {target.concurrency}: {longest:,}")
    check = Check("peak_gib", round(top / GIB, 3), "<=", round(budget / GIB, 3), fits, "" if fits else summary)
    return EnginePlan(engine=engine, fits=fits, summary=summary, target=target, precision=precision,
                      weights_bytes=weights_bytes, kv_bytes_per_token=kv_bytes_per_token(shape, kv_dtype_bytes),
                      kv_cache_bytes=kv, kv_capacity_tokens=None, activations_bytes=active,
                      overhead_bytes=overhead_bytes * target.gpus, per_replica_bytes=per_replica, peak_bytes=top,
                      budget_bytes=budget, capacity_bytes=target.capacity_bytes, max_concurrency=most,
                      max_context=longest, rollout_devices=target.gpus if target.rollout_overlap else 2 * target.gpus,
                      checks=(check,))
