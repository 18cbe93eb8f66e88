"""Which architectures the memory plan knows, and the fields of each family's config.json that change its
parameters or its KV cache. Anything else is refused as unsupported rather than planned as a plain decoder:
a Mixtral read as a dense Llama is 7.2B parameters instead of 46.7B, a confident wrong figure.

Each family's rules follow the transformers implementation of its model_type (tests/memory/test_families.py
counts the parameters of every family's model, built on the meta device, against parameter_count):
- llama, granite, smollm3: q, k, v, o biases with `attention_bias`, MLP biases with `mlp_bias` (smollm3's
  layers without rope change no parameter);
- olmo: norms without parameters; phi: biases everywhere, LayerNorms with biases, a two-matrix MLP
  (fc1, fc2), a biased lm_head, optional q/k LayerNorms (`qk_layernorm`);
- mistral, mixtral, phi3: `sliding_window` on every layer (null: none), the cache still the full context;
- qwen2, qwen2_moe: q, k, v biases always (`qkv_bias` for qwen2_moe); qwen3, qwen3_moe: per-head q and k
  RMSNorms; qwen2/qwen3 slide only with `use_sliding_window`, on layers >= `max_window_layers` (qwen2_moe:
  even layers below it; smollm3: its layers without rope);
- gemma, gemma2, gemma3_text: tied embeddings by default; gemma2 and gemma3 have four norms per layer
  (pre/post attention, pre/post feed-forward); gemma2 slides on even layers, gemma3 on 5 layers of every
  6 (`sliding_window_pattern`); gemma3 has q and k norms;
- mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3: mixture of experts (every expert's weights are
  held; `experts_per_token` of them compute);
- deepseek_v2, deepseek_v3: multi-head latent attention (MLA), dense MLPs on the first
  `first_k_dense_replace` layers, `n_shared_experts` shared experts of `moe_intermediate_size` each.
An explicit `layer_types` list (transformers 4.53+) overrides the sliding-layer rule. A layer whose cache is
window-bounded holds min(context, window) tokens of K and V (onnxruntime-genai 0.18: `windowed_kv_cache`).
"""

from __future__ import annotations

from typing import Any

from release.core.errors import InputError

# Fields that change the architecture in a way a family must understand; present (and not null, 0, false or
# empty) in a family that does not list them, the config is refused with the field's name.
ARCHITECTURE_FIELDS = {
    "num_local_experts": "mixture of experts",
    "num_experts": "mixture of experts",
    "n_routed_experts": "mixture of experts",
    "moe_intermediate_size": "mixture of experts",
    "shared_expert_intermediate_size": "shared experts",
    "n_shared_experts": "shared experts",
    "kv_lora_rank": "latent attention (MLA)",
    "q_lora_rank": "latent attention (MLA)",
    "use_mla": "latent attention (MLA)",
    "layers_block_type": "a hybrid of attention and other layers",
    "hybrid_override_pattern": "a hybrid of attention and SSM layers",
    "attn_layer_period": "a hybrid of attention and SSM layers",
    "attn_layer_indices": "a hybrid of attention and SSM layers",
    "mamba_d_state": "state-space (Mamba) layers",
    "mamba_expand": "state-space (Mamba) layers",
    "ssm_state_size": "state-space layers",
    "linear_num_value_heads": "linear attention layers",
    "full_attention_interval": "linear attention layers",
    "cross_attention_layers": "cross-attention layers",
    "text_config": "a multimodal model (plan its text model's config)",
    "vision_config": "a multimodal model",
    "audio_config": "a multimodal model",
    "altup_num_inputs": "Gemma 3n's AltUp layers",
    "num_kv_shared_layers": "KV sharing across layers",
    "no_rope_layers": "layers without rotary embeddings",
}
DEEPSEEK = frozenset({"n_routed_experts", "moe_intermediate_size", "n_shared_experts", "kv_lora_rank", "q_lora_rank"})
QWEN_MOE = frozenset({"num_experts", "moe_intermediate_size", "shared_expert_intermediate_size"})
# model_type -> the ARCHITECTURE_FIELDS it understands.
FAMILIES: dict[str, frozenset[str]] = {
    "llama": frozenset(), "granite": frozenset(), "mistral": frozenset(), "phi3": frozenset(),
    "qwen2": frozenset(), "qwen3": frozenset(), "gemma": frozenset(), "gemma2": frozenset(), "olmo": frozenset(),
    "phi": frozenset(), "smollm3": frozenset({"no_rope_layers"}),
    "gemma3_text": frozenset(), "mixtral": frozenset({"num_local_experts"}),
    "qwen2_moe": QWEN_MOE, "qwen3_moe": QWEN_MOE - {"shared_expert_intermediate_size"},
    "deepseek_v2": DEEPSEEK, "deepseek_v3": DEEPSEEK,
}
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3_text", "smollm3"})
# The transformers default `head_dim` where config.json leaves it out (elsewhere hidden_size / heads).
DEFAULT_HEAD_DIM = {"qwen3": 128, "gemma": 256, "gemma2": 256, "gemma3_text": 256}
# The transformers default `sliding_window` where config.json leaves the key out.
DEFAULT_WINDOW = {"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096}
KNOWN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def unsupported(source: str, reason: str) -> InputError:
    return InputError(f"{source}: unsupported architecture: {reason}",
                      hint=f"the memory plan knows {', '.join(sorted(FAMILIES))}; it refuses a figure it "
                           "cannot compute rather than guess one")


def check_supported(config: dict[str, Any], source: str = "config.json") -> str:
    """The config's model_type when the plan knows its architecture; InputError('unsupported ...') if not."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise unsupported(source, "no model_type (not a Hugging Face config.json?)")
    if model_type not in FAMILIES:
        raise unsupported(source, f"model_type '{model_type}'")
    for field, meaning in ARCHITECTURE_FIELDS.items():
        if field not in FAMILIES[model_type] and config.get(field) not in (None, 0, False, [], {}, ""):
            raise unsupported(source, f"'{field}' ({meaning}) in a {model_type} config")
    if model_type.startswith("deepseek") and config.get("moe_layer_freq", 1) not in (None, 1):
        raise unsupported(source, f"moe_layer_freq {config['moe_layer_freq']} (transformers builds every layer "
                                  "after first_k_dense_replace as MoE)")
    if model_type == "qwen3_moe" and config.get("use_sliding_window") and config.get("layer_types") is None:
        raise unsupported(source, "use_sliding_window in a qwen3_moe config (transformers gives it no layer_types)")
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise unsupported(source, f"layer_types {layer_types!r} is not a list of names")
        other = sorted(set(layer_types) - KNOWN_LAYER_TYPES)
        if other:
            raise unsupported(source, f"layer_types '{other[0]}' (the plan knows full and sliding attention)")
    return model_type


def sliding_layers(config: dict[str, Any], model_type: str, layers: int) -> tuple[int, int, int]:
    """(window, layers that attend through it, layers whose KV cache holds at most the window).

    The cache is bounded on the layers transformers' `layer_types` marks "sliding_attention" (explicit, or
    computed by the family's config class): onnxruntime-genai's builder sizes exactly those layers' past/present
    buffers to the window. Mistral, Mixtral and Phi3 set `sliding_window` without layer_types: every layer
    attends through the window, but the builder still allocates their caches at the full context.
    """
    window = config.get("sliding_window", DEFAULT_WINDOW.get(model_type))
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return 0, 0, 0
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list):
        if len(layer_types) != layers:
            raise InputError(f"layer_types has {len(layer_types)} entries for {layers} layers",
                             hint="layer_types needs one entry per layer")
        count = sum(t == "sliding_attention" for t in layer_types)
        return window, count, count
    if model_type in ("mistral", "mixtral", "phi3"):
        return window, layers, 0
    count = _computed_sliding(config, model_type, layers)
    return (window, count, count) if count else (0, 0, 0)


def _computed_sliding(config: dict[str, Any], model_type: str, layers: int) -> int:
    """How many layers the family's transformers config class marks sliding when config.json has no layer_types."""
    use = bool(config.get("use_sliding_window", False))
    first = config.get("max_window_layers", layers)
    first = first if isinstance(first, int) and not isinstance(first, bool) else layers
    if model_type in ("qwen2", "qwen3"):
        return max(0, layers - first) if use else 0
    if model_type == "qwen2_moe":
        return sum(1 for i in range(layers) if (i + 1) % 2 and i < first) if use else 0
    if model_type == "smollm3":  # the layers without rope slide (no_rope_layers[i] == 0)
        interval = config.get("no_rope_layer_interval", 4) or 4
        rope = config.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        return sum(1 for flag in rope[:layers] if not flag) if use else 0
    if model_type == "gemma2":
        return sum(1 for i in range(layers) if (i + 1) % 2)
    if model_type == "gemma3_text":
        pattern = config.get("sliding_window_pattern", 6)
        pattern = pattern if isinstance(pattern, int) and pattern > 0 else 6
        return sum(1 for i in range(layers) if (i + 1) % pattern)
    return 0  # llama, granite, gemma, olmo, phi, qwen3_moe, deepseek: full attention on every layer


def moe_layers(config: dict[str, Any], model_type: str, layers: int) -> int:
    """How many layers are mixture-of-experts blocks (the rest have a dense MLP)."""
    if model_type == "mixtral":
        return layers
    if model_type in ("qwen2_moe", "qwen3_moe"):
        dense = config.get("mlp_only_layers") or []
        step = config.get("decoder_sparse_step", 1) or 1
        return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        first = config.get("first_k_dense_replace", 0) or 0
        return max(0, layers - first)
    return 0


def family_layout(config: dict[str, Any], family: str, head_dim: int) -> dict[str, Any]:
    """The per-family parts of the layout: q/k norms, norm parameters, the MLP's form, lm_head's bias."""
    if family in ("qwen3", "qwen3_moe", "gemma3_text"):
        return dict(qk_norm=2 * head_dim)
    if family == "olmo":
        return dict(norms_per_layer=0, final_norm=False)
    if family == "phi":
        return dict(norms_per_layer=1, norm_bias=True, gated_mlp=False, lm_head_bias=True, attention_bias=True,
                    mlp_bias=True, qk_norm=4 * head_dim if config.get("qk_layernorm") else 0)
    return {}


def experts_layout(config: dict[str, Any], family: str, layers: int, source: str) -> dict[str, Any]:
    key = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts",
           "deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts"}.get(family)
    experts = (optional_int(config, key, source, zero=True) or 0) if key else 0
    if not experts:
        return {}
    per_token = positive_int(config, ("num_experts_per_tok",), source)
    width = (positive_int(config, ("intermediate_size",), source) if family == "mixtral"
             else positive_int(config, ("moe_intermediate_size",), source))
    shared = 0
    if family == "qwen2_moe":
        shared = optional_int(config, "shared_expert_intermediate_size", source, zero=True) or 0
    elif family in ("deepseek_v2", "deepseek_v3"):
        shared = (optional_int(config, "n_shared_experts", source, zero=True) or 0) * width
    return dict(experts=experts, experts_per_token=per_token, expert_intermediate=width, shared_intermediate=shared,
                shared_expert_gate=family == "qwen2_moe",  # built even when the shared expert has width 0
                moe_layers=moe_layers(config, family, layers))


def latent_layout(config: dict[str, Any], family: str, source: str) -> dict[str, Any]:
    if family not in ("deepseek_v2", "deepseek_v3"):
        return {}
    return dict(kv_lora_rank=positive_int(config, ("kv_lora_rank",), source),
                q_lora_rank=optional_int(config, "q_lora_rank", source, zero=True) or 0,
                **{f: positive_int(config, (f,), source) for f in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                                    "v_head_dim")})


def positive_int(config: dict[str, Any], keys: tuple[str, ...], source: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise InputError(f"{source}: no positive integer '{keys[0]}'",
                     hint="the memory plan needs layers, hidden size, heads, intermediate size, vocab size "
                          "and max_position_embeddings from the model's config.json")


def optional_int(config: dict[str, Any], key: str, source: str, zero: bool = False) -> int | None:
    """config[key] when a positive integer, None when absent (or 0 where `zero` allows it: 'none of these')."""
    value = config.get(key)
    if value is None or (zero and value == 0 and not isinstance(value, bool)):
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError(f"{source}: '{key}' is {value!r}, not a positive integer", hint=f"fix or drop '{key}'")
    return value
