"""onnxruntime-genai's memory plan of one replica on a target, and what would fit instead.

Per replica, in bytes (B = concurrent sequences, L = context tokens, P = prefill tokens per sequence,
T = B x P tokens in the largest forward pass, a = the io dtype's bytes, 4 for fp32 logits on cpu):
    weights    = the package's ONNX initializers, or the builder's layout computed from config.json
    KV cache   = 2 x layers x kv_heads x head_dim x kv_bytes x B x L   (onnxruntime-genai with
                 past_present_share_buffer allocates max_length = L for every sequence of the batch)
                 MLA (DeepSeek-V2/V3): layers x (kv_lora_rank + qk_rope_head_dim) x kv_bytes x B x L, the
                 compressed latent an MLA engine (vLLM, SGLang) caches instead of K and V;
                 a layer with a window-bounded cache holds min(L, window) tokens instead of L (Gemma2/3's
                 sliding layers; Mistral's window limits attention but its cache is the full context)
    workspace  = T x a x max(3h + 6I, 3h + 2q + 2kv)     hidden states live at the MLP (or attention) peak:
                                                          residual, norm and skip-sum (3h); gate, up, sigmoid,
                                                          SiLU product and its product with up (5I), plus
                                                          one I-wide tensor of allocator slack (fitted);
                                                          a MoE layer's I: its routed and shared experts' widths
               + T x V x a + B x V x 4                    prefill logits, and the last position in fp32
               + a floor per run (WORKSPACE_FLOOR_BYTES: the generator's and thread pool's own buffers)
    overhead   = a constant per device (RUNTIME_OVERHEAD_BYTES: cpu measured, cuda stated)
    overlap    = the replica being replaced, when old and new share the devices during a rolling update
The target fits when weights + KV + workspace + overhead + overlap <= devices x memory x (1 - headroom).
With several devices the weights and KV are assumed sharded evenly (onnxruntime-genai itself runs one
device per process; the figure is for engines that shard).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from release.backends.planning import (
    GIB,
    KV_DTYPE_BYTES,
    MIB,
    Target,
    hidden_activation_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_bytes_per_token_beyond_window,
    largest,
)
from release.backends.shape import (
    PRECISIONS,
    ModelShape,
    Precision,
    Provider,
    builder_weights_bytes,
    io_bytes,
    parameter_count,
)

# cpu: RSS of onnxruntime-genai with a loaded model minus that model's weights: 11-27 MiB over the
# models of benchmarks/memory.py (load_overhead per row), rounded up. cuda: the CUDA context plus
# cuBLAS/cuDNN handles and the arena's first chunk; stated, not measured here (scripts/gpu-check.sh
# measures it on a GPU).
RUNTIME_OVERHEAD_BYTES: dict[str, int] = {"cpu": 32 * MIB, "cuda": 768 * MIB}
# cpu: the intercept of RSS growth vs the formula over the tiny-model rows of benchmarks/memory.py.
WORKSPACE_FLOOR_BYTES: dict[str, int] = {"cpu": 2 * MIB, "cuda": 0}
# The builder's valid precision/provider pairs (fp16 is a GPU precision).
VALID = {"cpu": ("fp32", "int8", "int4"), "cuda": PRECISIONS}


@dataclass(frozen=True)
class ModelSpec:
    """The model being planned: its shape, precision and weight bytes (measured or computed)."""

    shape: ModelShape
    precision: Precision
    weights_bytes: int
    kv_dtype_bytes: int
    weights_source: Literal["package", "config"]

    @classmethod
    def from_config(cls, shape: ModelShape, precision: Precision, provider: Provider) -> ModelSpec:
        return cls(shape, precision, builder_weights_bytes(shape, precision, provider),
                   io_bytes(precision, provider), "config")


@dataclass(frozen=True)
class Breakdown:
    """One replica's memory on the target; sizes in bytes, for all devices together."""

    weights: int
    kv_cache: int
    workspace: int
    overhead: int
    overlap: int
    peak: int
    capacity: int
    budget: int
    kv_bytes_per_token: int
    fits: bool
    kv_bytes_per_token_beyond_window: int = 0  # sliding-window models: a token past the window (full layers)

    @property
    def replica(self) -> int:
        return self.weights + self.kv_cache + self.workspace + self.overhead

    @property
    def headroom_bytes(self) -> int:
        return self.capacity - self.peak

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = asdict(self)
        data["replica"] = self.replica
        data["headroom_bytes"] = self.headroom_bytes
        data["headroom_fraction"] = round(self.headroom_bytes / self.capacity, 6)
        data["gib"] = {k: round(v / GIB, 3) for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)
                       and not k.startswith("kv_bytes_per_token")}
        return data


def workspace_bytes(spec: ModelSpec, target: Target) -> int:
    """Activation workspace of the largest forward pass (module docstring); linear in concurrency."""
    s, b = spec.shape, target.concurrency
    prefill = min(target.prefill_tokens or target.context, target.context)
    tokens = b * prefill
    act = io_bytes(spec.precision, target.provider)
    hidden = hidden_activation_bytes(s, tokens, act)
    logits = tokens * s.vocab * act + b * s.vocab * 4
    return hidden + logits + WORKSPACE_FLOOR_BYTES[target.provider]


def breakdown(spec: ModelSpec, target: Target, overlap_bytes: int | None = None) -> Breakdown:
    """The plan for `spec` on `target`; `overlap_bytes` is the old replica's size (None: same as this one)."""
    kv_bytes = KV_DTYPE_BYTES[target.kv_dtype] if target.kv_dtype else spec.kv_dtype_bytes
    per_token = kv_bytes_per_token(spec.shape, kv_bytes)
    kv = kv_bytes_per_sequence(spec.shape, kv_bytes, target.context) * target.concurrency
    workspace = workspace_bytes(spec, target)
    overhead = RUNTIME_OVERHEAD_BYTES[target.provider] * target.gpus
    replica = spec.weights_bytes + kv + workspace + overhead
    overlap = 0 if not target.rollout_overlap else replica if overlap_bytes is None else overlap_bytes
    peak = replica + overlap
    budget = int(target.capacity_bytes * (1 - target.headroom))
    return Breakdown(weights=spec.weights_bytes, kv_cache=kv, workspace=workspace, overhead=overhead,
                     overlap=overlap, peak=peak, capacity=target.capacity_bytes, budget=budget,
                     kv_bytes_per_token=per_token, fits=peak <= budget,
                     kv_bytes_per_token_beyond_window=kv_bytes_per_token_beyond_window(spec.shape, kv_bytes))


def max_concurrency(spec: ModelSpec, target: Target, overlap_bytes: int | None = None) -> int:
    """The most concurrent sequences at `target.context` that fit."""
    return largest(lambda b: breakdown(spec, replace(target, concurrency=b), overlap_bytes).fits)


def max_context(spec: ModelSpec, target: Target, overlap_bytes: int | None = None) -> int:
    """The longest context at `target.concurrency` that fits, capped at the model's max_position_embeddings."""
    return largest(lambda n: breakdown(spec, replace(target, context=n), overlap_bytes).fits,
                   limit=spec.shape.max_positions)


def gpus_needed(spec: ModelSpec, target: Target, overlap_bytes: int | None = None, limit: int = 64) -> int | None:
    """The fewest devices of this kind on which the target fits (None beyond `limit`)."""
    for gpus in range(1, limit + 1):
        if breakdown(spec, replace(target, gpus=gpus), overlap_bytes).fits:
            return gpus
    return None


def spec_at(base: ModelSpec, precision: Precision, provider: Provider) -> ModelSpec:
    """`base` at another precision: the base itself when it already is, else the config arithmetic."""
    return base if precision == base.precision else ModelSpec.from_config(base.shape, precision, provider)


def parameters(spec: ModelSpec, active: bool = False) -> int:
    return parameter_count(spec.shape, active)
