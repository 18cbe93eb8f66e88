"""A decoder's shape from a Hugging Face config.json, its parameter count, and the bytes onnxruntime-genai's
model builder writes for it at each precision.

Parameters (what transformers' `model.num_parameters()` reports; the families in families.py):
    per layer   attention + MLP (or MoE block) + norms_per_layer x h
    attention   h x (q + 2 kv) + q x h   (q = heads x head_dim, kv = kv_heads x head_dim)
                + q + 2kv (+ h) of biases (qwen2's q, k, v; llama's attention_bias adds o) + q/k norms
    MLA         [h x q_lora + q_lora (norm) + q_lora x heads x (nope + rope)] or h x heads x (nope + rope)
                + h x (kv_lora + rope) + kv_lora (norm) + kv_lora x heads x (nope + v) + heads x v x h
    MLP         3 x h x I (gate, up, down) (+ 2I + h with mlp_bias); phi: 2 x h x I + I + h
    MoE block   E x 3 x h x I_e (every expert) + h x E (router) + 3 x h x I_s (shared experts)
                (+ h for qwen2_moe's shared-expert gate)
    model       layers x per layer + h (final norm) + V x h (embedding) + V x h (lm_head, unless tied)
    (a LayerNorm with a bias counts 2h; OLMo's norms have no parameters; phi's lm_head has a bias)
Active parameters (what one token computes with) count experts_per_token experts instead of E.
Checked: Llama-3-8B 8,030,261,248; Qwen2.5-7B 7,615,616,512; Mixtral-8x7B 46,702,792,704;
DeepSeek-V2-Lite 15,706,484,224 (tests/memory/test_published.py).

The layout rules are those of the builder in onnxruntime-genai 0.18 (checked against real builds in
tests/memory/test_shape.py):
- fp32 / fp16: every weight in the io dtype (fp32 on cpu; fp16 on cuda except at fp32);
- int8 / int4: every linear layer (fused q|k|v, o, gate, up, down, lm_head) is MatMulNBits with blocks of
  32 along K: N x ceil(K/32) x 32 x bits/8 bytes of packed weights plus N x ceil(K/32) scales in the io
  dtype (symmetric: no zero points); embeddings, norms and biases stay in the io dtype;
- tied embeddings are stored once (as lm_head; at int4 the embedding gathers from the quantized
  lm_head), except at int8, where the builder keeps a float embedding beside the int8 lm_head;
- the rotary cos and sin caches: 2 x max_position_embeddings x rotary_dim/2 in the io dtype.
For families the builder cannot build (mixture of experts, MLA) the same rules give the bytes of every
linear layer, experts included, quantized the builder's way: an estimate of the weights any engine holds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from release.backends.families import (
    DEFAULT_HEAD_DIM,
    TIED_BY_DEFAULT,
    check_supported,
    experts_layout,
    family_layout,
    latent_layout,
    optional_int,
    positive_int,
    sliding_layers,
)
from release.core.errors import InputError

Precision = Literal["fp32", "fp16", "int8", "int4"]
Provider = Literal["cpu", "cuda"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8", "int4")
BLOCK_SIZE = 32
_BITS = {"int8": 8, "int4": 4}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder that its parameters and memory depend on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied_embeddings: bool = False
    attention_bias: bool = False  # q, k, v and o biases (llama's attention_bias)
    mlp_bias: bool = False
    rotary_dim: int = 0  # 0: the whole head_dim
    family: str = "llama"
    qkv_bias: bool = False  # q, k and v biases without o (qwen2)
    norms_per_layer: int = 2  # 0: OLMo's norms have no parameters
    norm_bias: bool = False  # LayerNorm with a bias (phi): 2h per norm, the final norm too
    final_norm: bool = True
    qk_norm: int = 0  # parameters of the per-head q and k norms of one layer (qwen3, gemma3, phi's qk_layernorm)
    gated_mlp: bool = True  # gate, up, down; False: fc1, fc2 (phi)
    lm_head_bias: bool = False
    # Mixture of experts: `moe_layers` layers hold `experts` MLPs of width `expert_intermediate` (the rest a
    # dense MLP of `intermediate`), a router, and shared experts of total width `shared_intermediate`.
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    shared_expert_gate: bool = False
    moe_layers: int = 0
    # Multi-head latent attention: K and V are cached as one kv_lora_rank latent plus the rope key.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention: `sliding_layers` layers attend over the last `sliding_window` tokens; the
    # `window_cache_layers` among them keep only that many tokens of K and V (families.sliding_layers).
    sliding_window: int = 0
    sliding_layers: int = 0
    window_cache_layers: int = 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim)

    @property
    def kv_dim(self) -> int:
        """Width of K (or V) per token as attention computes it (MLA: decompressed per head)."""
        if self.mla:
            return self.heads * max(self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim)
        return self.kv_heads * self.head_dim

    @property
    def mlp_width(self) -> int:
        """The widest MLP one token passes through (dense, or its routed and shared experts)."""
        moe = self.experts_per_token * self.expert_intermediate + self.shared_intermediate if self.moe_layers else 0
        return max(self.intermediate if self.moe_layers < self.layers else 0, moe)

    @property
    def kv_elements_per_layer(self) -> int:
        """Cached elements per token per layer: K and V of every KV head, or MLA's latent plus rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.mla else 2 * self.kv_heads * self.head_dim

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
    """The ModelShape of an HF config.json; InputError naming the first field the formulas need but lack, or
    saying 'unsupported architecture' for a family or field the plan does not know."""
    values = {name: positive_int(config, keys, source) for name, keys in _REQUIRED.items()}
    family = check_supported(config, source)
    kv_heads = optional_int(config, "num_key_value_heads", source) or values["heads"]
    head_dim = (optional_int(config, "head_dim", source) or DEFAULT_HEAD_DIM.get(family)
                or values["hidden"] // values["heads"])
    if values["heads"] % kv_heads:
        raise InputError(f"{source}: num_attention_heads {values['heads']} is not a multiple of "
                         f"num_key_value_heads {kv_heads}", hint="check the attention fields of config.json")
    factor = config.get("partial_rotary_factor", 1.0)
    rotary = int(head_dim * factor) if isinstance(factor, int | float) and 0 < factor <= 1 else head_dim
    window, windowed, bounded = sliding_layers(config, family, values["layers"])
    tied = config.get("tie_word_embeddings", family in TIED_BY_DEFAULT)
    fields: dict[str, Any] = dict(
        kv_heads=kv_heads, head_dim=head_dim, tied_embeddings=bool(tied), rotary_dim=rotary, family=family,
        attention_bias=bool(config.get("attention_bias", False)), mlp_bias=bool(config.get("mlp_bias", False)),
        qkv_bias=family == "qwen2" or (family == "qwen2_moe" and bool(config.get("qkv_bias", True))),
        norms_per_layer=4 if family in ("gemma2", "gemma3_text") else 2,
        sliding_window=window, sliding_layers=windowed, window_cache_layers=bounded,
        **experts_layout(config, family, values["layers"], source), **latent_layout(config, family, source), **values,
    )
    fields.update(family_layout(config, family, head_dim))
    if family in ("deepseek_v2", "deepseek_v3"):
        fields["rotary_dim"] = fields["qk_rope_head_dim"]
    return ModelShape(**fields)


# (K, N, count): `count` K x N linear layers.
Linear = tuple[int, int, int]


def _attention(s: ModelShape) -> tuple[list[Linear], int]:
    """One layer's attention: its linear layers and its other (norm and bias) parameters."""
    if s.mla:
        qk, linears = s.qk_nope_head_dim + s.qk_rope_head_dim, []
        vectors = s.kv_lora_rank + ((s.q_lora_rank + s.kv_lora_rank + s.qk_rope_head_dim + s.hidden)
                                    if s.attention_bias else 0)
        if s.q_lora_rank:
            linears += [(s.hidden, s.q_lora_rank, 1), (s.q_lora_rank, s.heads * qk, 1)]
            vectors += s.q_lora_rank
        else:
            linears.append((s.hidden, s.heads * qk, 1))
        linears += [(s.hidden, s.kv_lora_rank + s.qk_rope_head_dim, 1),
                    (s.kv_lora_rank, s.heads * (s.qk_nope_head_dim + s.v_head_dim), 1),
                    (s.heads * s.v_head_dim, s.hidden, 1)]
        return linears, vectors
    qkv = s.q_dim + 2 * s.kv_dim
    vectors = (qkv + s.hidden if s.attention_bias else qkv if s.qkv_bias else 0) + s.qk_norm
    return [(s.hidden, qkv, 1), (s.q_dim, s.hidden, 1)], vectors


def _mlp(s: ModelShape, width: int, count: int = 1) -> tuple[list[Linear], int]:
    inputs = 2 if s.gated_mlp else 1  # gate and up, or fc1 alone
    bias = (inputs * width + s.hidden) * count if s.mlp_bias else 0
    return [(s.hidden, width, inputs * count), (width, s.hidden, count)], bias


def _inventory(s: ModelShape, active: bool = False) -> tuple[list[Linear], int]:
    """Every linear layer of the decoder stack (lm_head and embeddings apart) and its other parameters;
    `active`: only the experts one token is routed to."""
    attention, attention_vectors = _attention(s)
    dense, dense_vectors = _mlp(s, s.intermediate)
    linears = [(k, n, c * s.layers) for k, n, c in attention]
    linears += [(k, n, c * (s.layers - s.moe_layers)) for k, n, c in dense]
    vectors = s.layers * (attention_vectors + s.norms_per_layer * _norm(s)) + (s.layers - s.moe_layers) * dense_vectors
    if s.moe_layers:
        routed, _ = _mlp(s, s.expert_intermediate, s.experts_per_token if active else s.experts)
        block = [*routed, (s.hidden, s.experts, 1)]
        if s.shared_intermediate:
            shared, shared_vectors = _mlp(s, s.shared_intermediate)
            block += shared
            vectors += s.moe_layers * shared_vectors
        if s.shared_expert_gate:
            block.append((s.hidden, 1, 1))
        linears += [(k, n, c * s.moe_layers) for k, n, c in block]
    return linears, vectors


def _norm(s: ModelShape) -> int:
    return s.hidden * (2 if s.norm_bias else 1)


def _head(s: ModelShape) -> int:
    """The final norm and lm_head's bias (the embedding matrices apart)."""
    return (_norm(s) if s.final_norm else 0) + (s.vocab if s.lm_head_bias else 0)


def parameter_count(shape: ModelShape, active: bool = False) -> int:
    """Parameters of the Hugging Face model (what `model.num_parameters()` reports; module docstring);
    `active`: those one token computes with (experts_per_token of the experts; all of a dense model)."""
    linears, vectors = _inventory(shape, active)
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    return sum(k * n * c for k, n, c in linears) + vectors + _head(shape) + embeddings


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
    linears, vectors = _inventory(s)
    # A K x N layer's bytes are linear in N, so c layers cost the same as one K x (c x N) (and fused q|k|v
    # or gate|up as much as the separate layers).
    stack = sum(linear_bytes(k, n * c, precision, provider) for k, n, c in linears if c) + vectors * io
    float_embedding = not s.tied_embeddings or precision == "int8"
    embeddings = linear_bytes(s.hidden, s.vocab, precision, provider)
    embeddings += s.vocab * s.hidden * io if float_embedding else 0
    rotary = s.rotary_dim or s.head_dim
    rope_caches = 2 * s.max_positions * (rotary // 2) * io
    return stack + _head(s) * io + embeddings + rope_caches
