"""Which Hugging Face configs onnxruntime-genai 0.18's model builder can really build: one place for the rules.

Pure functions over config.json as a dict (no I/O, no heavy imports), so `relctl check`, the convert stage
and a backend's `supports(config)` can all ask in microseconds, before any slow stage.

- `genai_config_problems(config)`: the reasons the builder cannot build this config correctly (empty when
  it can). Each rule comes from reading the builder (onnxruntime_genai/models/builder.py and builders/):
  a config it crashes on after the slow stages, or one it builds into a model whose numbers differ from
  the checkpoint's without a word.
- `builder_config(config)`: the config.json to hand the builder. transformers 5 writes two shapes the 0.18
  builder misreads although the model is fine; relctl restates them without changing what they mean.
"""

from __future__ import annotations

import copy
from typing import Any

from release.backends.base import architecture

# Text decoders the builder turns into a genai model (builder.py's architecture switch, minus multimodal
# and speech models, which relctl does not serve).
GENAI_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
    "PhiForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GraniteForCausalLM",
    "OlmoForCausalLM", "NemotronForCausalLM", "SmolLM3ForCausalLM", "InternLM2ForCausalLM",
    "Ernie4_5ForCausalLM",
})

# RoPE types the builder implements, per builder class. The base Model knows default, linear and yarn
# and raises on others; LlamaModel (Llama, SmolLM3) replaces that with llama3 only, so a Llama with
# linear or yarn scaling would build *without* its scaling; Phi-3's long-context class knows longrope.
_BASE_ROPE = frozenset({"default", "linear", "yarn"})
_ROPE_TYPES: dict[str, frozenset[str]] = {
    "LlamaForCausalLM": frozenset({"default", "llama3"}),
    "SmolLM3ForCausalLM": frozenset({"default", "llama3"}),
    "Gemma3ForCausalLM": frozenset({"default"}),
}
# transformers' legacy names for rope types (rope_scaling's "type").
_ROPE_ALIASES = {"su": "longrope", "dynamic": "dynamic"}


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of a flat config: transformers 5's rope_parameters, else 4.x's rope_scaling."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return dict(rope) if isinstance(rope, dict) else {}


def rope_type(rope: dict[str, Any]) -> str:
    kind = str(rope.get("rope_type") or rope.get("type") or "default")
    return _ROPE_ALIASES.get(kind, kind)


def _per_layer_type(rope: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """transformers 5's per-layer-type rope ({"full_attention": {...}, "sliding_attention": {...}}), or {}."""
    nested = {k: v for k, v in rope.items() if k.endswith("_attention") and isinstance(v, dict)}
    return nested if "rope_type" not in rope and "type" not in rope else {}


def genai_config_problems(config: dict[str, Any]) -> list[str]:
    """Why onnxruntime-genai 0.18's builder cannot build `config` correctly; empty when it can."""
    arch = architecture(config)
    if arch not in GENAI_ARCHITECTURES:
        return [f"architecture '{arch or config.get('model_type') or 'unknown'}' is not one onnxruntime-genai's "
                f"model builder builds (it builds {', '.join(sorted(GENAI_ARCHITECTURES))})"]
    problems: list[str] = []
    rope = rope_parameters(config)
    nested = _per_layer_type(rope)
    kinds = {f"rope_parameters.{k}": rope_type(v) for k, v in nested.items()} if nested else {
        "rope type": rope_type(rope)}
    allowed = _ROPE_TYPES.get(arch, _BASE_ROPE | ({"longrope"} if arch == "Phi3ForCausalLM" else frozenset()))
    for where, kind in kinds.items():
        if kind not in allowed:
            problems.append(f"{where} '{kind}' on {arch}: the builder implements {', '.join(sorted(allowed))} "
                            "for this architecture (it would fail or build the model without its scaling)")
    if nested and arch != "Gemma3ForCausalLM":
        problems.append(f"per-layer-type rope_parameters on {arch}: the builder reads one rope setting")
    problems += _rotary_problems(config, rope)
    problems += _family_problems(arch, config, rope)
    return problems


def _head_dim(config: dict[str, Any]) -> int:
    head_dim = config.get("head_dim")
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else 0


def _rotary_problems(config: dict[str, Any], rope: dict[str, Any]) -> list[str]:
    # The builder fuses RoPE into GroupQueryAttention, whose kernel needs the cos/sin cache width (rotary
    # dims / 2) to be a multiple of 8: otherwise the model builds and then fails on its first token.
    head_dim = _head_dim(config)
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if not head_dim or not isinstance(factor, int | float):
        return []
    rotary = int(head_dim * float(factor))
    if (rotary // 2) % 8 == 0:
        return []
    return [f"rotary dimensions {rotary} (head_dim {head_dim} x partial_rotary_factor {factor}): onnxruntime's "
            "fused rotary attention needs rotary_dim / 2 to be a multiple of 8"]


def _family_problems(arch: str, config: dict[str, Any], rope: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    layers = config.get("num_hidden_layers")
    if arch == "SmolLM3ForCausalLM":
        no_rope = config.get("no_rope_layers") or []
        nope = [i for i, use in enumerate(no_rope[:layers] if isinstance(layers, int) else no_rope) if not use]
        if nope:
            # SmolLM3Model turns fused RoPE off for these layers and then asks for a position_ids input the
            # graph does not have (KeyError 'position_ids'): the builder cannot build NoPE layers.
            problems.append(f"SmolLM3 layers without RoPE (no_rope_layers is 0 at {nope}): onnxruntime-genai "
                            "0.18's builder cannot build NoPE layers")
    if arch == "OlmoForCausalLM" and config.get("clip_qkv") is not None:
        problems.append(f"OLMo clip_qkv {config['clip_qkv']}: the builder ignores the q/k/v clipping, so the "
                        "model would not compute what the checkpoint computes")
    if arch == "Phi3ForCausalLM" and rope_type(rope) == "longrope":
        maximum = config.get("max_position_embeddings")
        original = config.get("original_max_position_embeddings", rope.get("original_max_position_embeddings"))
        if isinstance(maximum, int) and isinstance(original, int) and maximum <= original:
            problems.append(f"Phi-3 longrope with max_position_embeddings {maximum} not above "
                            f"original_max_position_embeddings {original}: the long-context rope has no range "
                            "to scale (set rope_type default, or the published lengths)")
        half = _head_dim(config) // 2
        for key in ("short_factor", "long_factor"):
            got = rope.get(key)
            if not isinstance(got, list) or len(got) != half:
                problems.append(f"Phi-3 longrope {key}: {half} values needed (head_dim / 2), config has "
                                f"{len(got) if isinstance(got, list) else 'none'}")
    return problems


def builder_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` restated for the 0.18 builder: same model, the shape its reader expects.

    - Phi-3 whose max_position_embeddings differs from original_max_position_embeddings without longrope
      (transformers' Phi3Config keeps original at 4096 when a smaller context is set): the builder picks its
      long-context class on the lengths alone and crashes (KeyError 'multi_cache'); for non-longrope rope
      transformers never reads the original length, so it is set to the maximum.
    - Gemma-3 with transformers 5's per-layer-type rope_parameters: the builder reads one rope_type and a
      rope_local_base_freq; the global (full_attention) settings go on top and the sliding layers' theta as
      rope_local_base_freq, beside the nested entries transformers 5 reads back.
    - A sliding window wider than the context (Gemma-2's config class keeps sliding_window 4096 whatever
      max_position_embeddings is): attention over it is attention over everything, but the builder sizes the
      windowed layers' KV cache to the context and the window to sliding_window, and onnxruntime refuses at
      the first token ("KV cache capacity (256) must be at least local_window_size (4096)"). The window is
      clamped to the context: the same attention, a cache that holds it.
    """
    out = copy.deepcopy(config)
    arch = architecture(config)
    rope = rope_parameters(config)
    if arch == "Phi3ForCausalLM" and rope_type(rope) != "longrope":
        maximum = config.get("max_position_embeddings")
        if isinstance(maximum, int) and config.get("original_max_position_embeddings") not in (None, maximum):
            out["original_max_position_embeddings"] = maximum
    nested = _per_layer_type(rope)
    if arch == "Gemma3ForCausalLM" and "full_attention" in nested:
        local = nested.get("sliding_attention", {}).get("rope_theta", config.get("rope_local_base_freq"))
        flat = {**nested["full_attention"], **({"rope_local_base_freq": local} if local is not None else {})}
        out["rope_parameters"] = {**flat, **nested}
    window, context = config.get("sliding_window"), config.get("max_position_embeddings")
    if isinstance(window, int) and isinstance(context, int) and 0 < context < window:
        out["sliding_window"] = context
    return out
