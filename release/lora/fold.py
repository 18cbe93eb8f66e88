"""The arithmetic of peft 0.21's `merge_and_unload`, op for op, so the merged bits are peft's bits.

Each function repeats the exact sequence of torch operations peft runs on the same dtypes and the same
memory layouts (a transpose is a view, as in peft): elementwise results are then identical, and so are
the reductions (DoRA's weight norm), whose summation order follows the layout.

Two rewrites keep the bits and save time and memory, used on the hot path (plain LoRA): the product
B @ A goes into a reused buffer (same GEMM) and is scaled in place (an elementwise op gives the same
value either way); and a bf16/fp16 weight plus the fp32 delta, which torch computes by widening to fp32,
adding and rounding once to the weight's dtype, is done as exactly those three steps in a reused fp32
buffer, which is faster than torch's mixed-dtype in-place kernel.

Adapter tensors arrive already cast to `adapter_dtype(base dtype)`: `PeftModel.from_pretrained` builds
the LoRA layers in the base layer's dtype and, with its default `autocast_adapter_dtype=True`, upcasts
fp16/bf16 ones to fp32 before the saved values are copied in.
"""

from __future__ import annotations

import torch

from release.lora.workspace import Workspace

WIDE_BLOCK = 1 << 20  # elements widened at a time (4 MiB in fp32)


def adapter_dtype(base_dtype: torch.dtype) -> torch.dtype:
    """The dtype peft computes a LoRA delta in for a base weight of `base_dtype`."""
    return torch.float64 if base_dtype == torch.float64 else torch.float32


def _transpose(weight: torch.Tensor, fan_in_fan_out: bool) -> torch.Tensor:
    # peft.utils.other.transpose
    return weight.T if fan_in_fan_out else weight


def _scaled_product(a: torch.Tensor, b: torch.Tensor, scaling: float, workspace: Workspace | None) -> torch.Tensor:
    if workspace is None:
        return (b @ a).mul_(scaling)
    product = workspace.take("delta", (b.shape[0], a.shape[1]), a.dtype)
    return torch.matmul(b, a, out=product).mul_(scaling)


def linear_delta(a: torch.Tensor, b: torch.Tensor, scaling: float, fan_in_fan_out: bool,
                 workspace: Workspace | None = None) -> torch.Tensor:
    """lora.Linear.get_delta_weight: transpose(B @ A) * scaling (the transpose is a view either way)."""
    return _transpose(_scaled_product(a, b, scaling, workspace), fan_in_fan_out)


def embedding_delta(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """lora.Embedding.get_delta_weight: (B @ A).T * scaling, with A (r, vocab) and B (dim, r)."""
    return _transpose(_scaled_product(a, b, scaling, None), True)


def fold_linear(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                fan_in_fan_out: bool, workspace: Workspace | None = None) -> torch.Tensor:
    """lora.Linear.merge: the fp32 delta is added in place to the base weight in its own dtype."""
    delta = linear_delta(a, b, scaling, fan_in_fan_out, workspace)
    if workspace is None or weight.dtype == delta.dtype:
        weight += delta
        return weight
    # Widen, add, round back, a block of rows at a time: elementwise, so blocks change no bit.
    rows = max(1, WIDE_BLOCK // max(1, weight.shape[1]))
    for start in range(0, weight.shape[0], rows):
        part = weight[start:start + rows]
        wide = workspace.take("wide", tuple(part.shape), delta.dtype)
        wide.copy_(part)
        wide += delta[start:start + rows]
        part.copy_(wide)
    return weight


def fold_embedding(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """lora.Embedding.merge: unlike Linear, the delta is cast to the base dtype before the add."""
    weight += embedding_delta(a, b, scaling).to(weight.dtype)
    return weight


def _weight_norm(weight: torch.Tensor, lora_weight: torch.Tensor, fan_in_fan_out: bool) -> torch.Tensor:
    # DoraLinearLayer.get_weight_norm called with scaling=1, since the delta already holds the scaling
    weight = _transpose(weight, fan_in_fan_out)
    weight = weight + 1 * lora_weight
    norm: torch.Tensor = torch.linalg.norm(weight, dim=1)
    return norm.to(weight.dtype)


def fold_dora_linear(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, magnitude: torch.Tensor,
                     scaling: float, fan_in_fan_out: bool) -> torch.Tensor:
    """DoraLinearVariant.merge_unsafe: magnitude / ||W + dW|| (row-wise) times (W + dW)."""
    orig_dtype = weight.dtype
    delta = linear_delta(a, b, scaling, fan_in_fan_out)
    weight_norm = _weight_norm(weight, _transpose(delta, fan_in_fan_out), fan_in_fan_out)
    dora_factor = magnitude / weight_norm
    dora_factor = _transpose(dora_factor.view(-1, 1), fan_in_fan_out)
    return (dora_factor * (weight + delta)).to(orig_dtype)


def fold_dora_embedding(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, magnitude: torch.Tensor,
                        scaling: float) -> torch.Tensor:
    """DoraEmbeddingVariant.merge_unsafe: the norm runs over the vocabulary, one per embedding dim."""
    orig_dtype = weight.dtype
    delta = embedding_delta(a, b, scaling)
    weight_norm = _weight_norm(weight, delta.T, True)
    dora_factor = (magnitude / weight_norm).view(1, -1)
    return (dora_factor * (weight + delta)).to(orig_dtype)


def fold_lora_bias(bias: torch.Tensor, b_bias: torch.Tensor, scaling: float) -> torch.Tensor:
    """lora.Linear.merge with lora_bias=True: bias += lora_B.bias * scaling, in the base bias's dtype."""
    bias += b_bias * scaling
    return bias
