"""The arithmetic of peft 0.21's `merge_and_unload`, op for op, so the merged bits are peft's bits.

Each function repeats the exact sequence of torch operations peft runs on the same dtypes and the same
memory layouts (a transpose is a view, as in peft): elementwise results are then identical, and so are
the reductions (DoRA's weight norm), whose summation order follows the layout.

Adapter tensors arrive already cast to `adapter_dtype(base dtype)`: `PeftModel.from_pretrained` builds
the LoRA layers in the base layer's dtype and, with its default `autocast_adapter_dtype=True`, upcasts
fp16/bf16 ones to fp32 before the saved values are copied in.
"""

from __future__ import annotations

import torch


def adapter_dtype(base_dtype: torch.dtype) -> torch.dtype:
    """The dtype peft computes a LoRA delta in for a base weight of `base_dtype`."""
    return torch.float64 if base_dtype == torch.float64 else torch.float32


def _transpose(weight: torch.Tensor, fan_in_fan_out: bool) -> torch.Tensor:
    # peft.utils.other.transpose
    return weight.T if fan_in_fan_out else weight


def linear_delta(a: torch.Tensor, b: torch.Tensor, scaling: float, fan_in_fan_out: bool) -> torch.Tensor:
    """lora.Linear.get_delta_weight: transpose(B @ A) * scaling."""
    return _transpose(b @ a, fan_in_fan_out) * scaling


def embedding_delta(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """lora.Embedding.get_delta_weight: (B @ A).T * scaling, with A (r, vocab) and B (dim, r)."""
    return _transpose(b @ a, True) * scaling


def fold_linear(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                fan_in_fan_out: bool) -> torch.Tensor:
    """lora.Linear.merge: the fp32 delta is added in place to the base weight in its own dtype."""
    weight += linear_delta(a, b, scaling, fan_in_fan_out)
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
