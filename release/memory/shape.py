"""A decoder's shape from a Hugging Face config.json, its parameter count, and the bytes onnxruntime-genai's
model builder writes for it at each precision.

The layout rules are those of the builder in onnxruntime-genai 0.18 (checked against real builds in
tests/memory/test_shape.py):
- fp32 / fp16: every weight in the io dtype (fp32 on cpu; fp16 on cuda except at fp32);
- int8 / int4: every linear layer (fused q|k|v, o, gate, up, down, lm_head) is MatMulNBits with blocks of
  32 along K: N x ceil(K/32) x 32 x bits/8 bytes of packed weights plus N x ceil(K/32) scales in the io
  dtype (symmetric: no zero points); embeddings and norms stay in the io dtype;
- tied embeddings are stored once (as lm_head; at int4 the embedding gathers from the quantized
  lm_head), except at int8, where the builder keeps a float embedding beside the int8 lm_head;
- the rotary cos and sin caches: 2 x max_position_embeddings x rotary_dim/2 in the io dtype.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from release.errors import InputError

Precision = Literal["fp32", "fp16", "int8", "int4"]
Provider = Literal["cpu", "cuda"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8", "int4")
BLOCK_SIZE = 32
_BITS = {"int8": 8, "int4": 4}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder that its memory depends on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    rotary_dim: int = 0  # 0: the whole head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# (field, config.json keys tried in order): the fields the formulas need.
_REQUIRED = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions"),
}


def shape_from_config(config: dict[str, Any], source: str = "config.json") -> ModelShape:
    """The ModelShape of an HF config.json; InputError naming the first field the formulas need but lack."""
    values = {name: _positive_int(config, keys, source) for name, keys in _REQUIRED.items()}
    kv_heads = _optional_int(config, "num_key_value_heads", source) or values["heads"]
    head_dim = _optional_int(config, "head_dim", source) or values["hidden"] // values["heads"]
    if values["heads"] % kv_heads:
        raise InputError(f"{source}: num_attention_heads {values['heads']} is not a multiple of "
                         f"num_key_value_heads {kv_heads}", hint="check the attention fields of config.json")
    factor = config.get("partial_rotary_factor", 1.0)
    rotary = int(head_dim * factor) if isinstance(factor, int | float) and 0 < factor <= 1 else head_dim
    return ModelShape(
        kv_heads=kv_heads, head_dim=head_dim, tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", False)), mlp_bias=bool(config.get("mlp_bias", False)),
        rotary_dim=rotary, **values,
    )


def _positive_int(config: dict[str, Any], keys: tuple[str, ...], source: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise InputError(f"{source}: no positive integer '{keys[0]}'",
                     hint="the memory plan needs layers, hidden size, heads, intermediate size, vocab size "
                          "and max_position_embeddings from the model's config.json")


def _optional_int(config: dict[str, Any], key: str, source: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError(f"{source}: '{key}' is {value!r}, not a positive integer", hint=f"fix or drop '{key}'")
    return value


def parameter_count(shape: ModelShape) -> int:
    """Parameters of the Hugging Face model (what `model.num_parameters()` reports)."""
    s = shape
    attention = s.hidden * (s.q_dim + 2 * s.kv_dim) + s.q_dim * s.hidden
    if s.attention_bias:
        attention += s.q_dim + 2 * s.kv_dim + s.hidden
    mlp = 3 * s.hidden * s.intermediate + (2 * s.intermediate + s.hidden if s.mlp_bias else 0)
    per_layer = attention + mlp + 2 * s.hidden
    embeddings = s.vocab * s.hidden * (1 if s.tied_embeddings else 2)
    return s.layers * per_layer + s.hidden + embeddings


def io_bytes(precision: Precision, provider: Provider) -> int:
    """Bytes of the builder's io dtype: activations, norms, embeddings, scales and (by default) the KV cache."""
    return 4 if provider == "cpu" or precision == "fp32" else 2


def linear_bytes(k: int, n: int, precision: Precision, provider: Provider) -> int:
    """Bytes of one K x N linear layer as the builder stores it (MatMulNBits when quantized)."""
    io = io_bytes(precision, provider)
    if precision not in _BITS:
        return k * n * io
    blocks = math.ceil(k / BLOCK_SIZE)
    return n * blocks * (BLOCK_SIZE * _BITS[precision] // 8) + n * blocks * io


def builder_weights_bytes(shape: ModelShape, precision: Precision, provider: Provider) -> int:
    """Bytes of every initializer the builder writes for `shape` at `precision` for `provider`."""
    s, io = shape, io_bytes(precision, provider)

    def linear(k: int, n: int) -> int:
        return linear_bytes(k, n, precision, provider)

    layer = linear(s.hidden, s.q_dim + 2 * s.kv_dim) + linear(s.q_dim, s.hidden)
    layer += 2 * linear(s.hidden, s.intermediate) + linear(s.intermediate, s.hidden)
    biases = (s.q_dim + 2 * s.kv_dim + s.hidden if s.attention_bias else 0)
    biases += (2 * s.intermediate + s.hidden if s.mlp_bias else 0)
    layer += (biases + 2 * s.hidden) * io
    float_embedding = not s.tied_embeddings or precision == "int8"
    embeddings = linear(s.hidden, s.vocab) + (s.vocab * s.hidden * io if float_embedding else 0)
    rotary = s.rotary_dim or s.head_dim
    rope_caches = 2 * s.max_positions * (rotary // 2) * io
    return s.layers * layer + s.hidden * io + embeddings + rope_caches
