"""Every family the plan knows, against transformers itself: the model built on the meta device (no
weights allocated) from a small config of each family and variant must have exactly parameter_count's
parameters, and its config's layer_types (what onnxruntime-genai's builder reads) exactly the layers whose
KV cache the plan bounds at the window."""

from __future__ import annotations

from typing import Any

import pytest

from release.backends.families import FAMILIES
from release.backends.shape import parameter_count, shape_from_config

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
MLA = {**MOE, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12,
       "n_routed_experts": 5, "n_shared_experts": 2, "first_k_dense_replace": 2, "num_key_value_heads": 4}
# (model_type, extra config.json fields): each variant exercises a rule of families.py.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama", {}),
    ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True, "head_dim": 24}),
    ("granite", {"attention_bias": True}),
    ("smollm3", {}),
    ("smollm3", {"tie_word_embeddings": False, "use_sliding_window": True, "sliding_window": 32,
                 "max_window_layers": 2, "no_rope_layers": [1, 1, 0, 1, 1, 0]}),
    ("olmo", {"attention_bias": True}),
    ("phi", {"partial_rotary_factor": 0.4}),
    ("phi", {"qk_layernorm": True, "tie_word_embeddings": True}),
    ("mistral", {"sliding_window": 32}),
    ("mistral", {"sliding_window": None, "head_dim": 32}),
    ("phi3", {"sliding_window": 64, "partial_rotary_factor": 0.5}),
    ("qwen2", {}),
    ("qwen2", {"tie_word_embeddings": True, "use_sliding_window": True, "sliding_window": 64,
               "max_window_layers": 4}),
    ("qwen3", {"head_dim": 32}),
    ("qwen3", {}),  # transformers' default head_dim, 128
    ("qwen3", {"attention_bias": True, "layer_types": ["full_attention", "sliding_attention"] * 3,
               "sliding_window": 16}),
    ("gemma", {"head_dim": 32}),
    ("gemma", {}),  # 256
    ("gemma2", {"head_dim": 32, "sliding_window": 16}),
    ("gemma3_text", {"head_dim": 32, "sliding_window": 16}),
    ("gemma3_text", {"head_dim": 32, "sliding_window": 16, "tie_word_embeddings": False,
                     "layer_types": ["sliding_attention", "full_attention"] * 3}),
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ("mixtral", {"num_local_experts": 3, "num_experts_per_tok": 1, "sliding_window": 16}),
    ("qwen2_moe", {**MOE, "num_experts": 6, "shared_expert_intermediate_size": 48}),
    ("qwen2_moe", {**MOE, "num_experts": 6, "shared_expert_intermediate_size": 0, "decoder_sparse_step": 2,
                   "mlp_only_layers": [1, 4], "qkv_bias": False, "use_sliding_window": True, "sliding_window": 32,
                   "max_window_layers": 4}),
    ("qwen3_moe", {**MOE, "num_experts": 8, "head_dim": 32, "mlp_only_layers": [0]}),
    ("deepseek_v2", {**MLA, "q_lora_rank": None}),
    ("deepseek_v2", {**MLA, "q_lora_rank": 24, "attention_bias": True, "n_shared_experts": 1}),
    ("deepseek_v3", {**MLA, "q_lora_rank": 24, "n_group": 1, "topk_group": 1}),
]


def transformers_model(config: dict[str, Any]) -> tuple[int, list[str] | None]:
    """(parameters, layer_types) of transformers' own model for `config`, built without allocating weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return model.num_parameters(), getattr(hf, "layer_types", None)


@pytest.mark.parametrize(("model_type", "extra"), CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_parameter_count_equals_transformers(model_type: str, extra: dict[str, Any]) -> None:
    config = {**BASE, "model_type": model_type, **extra}
    shape = shape_from_config(config)
    params, layer_types = transformers_model(config)
    assert parameter_count(shape) == params
    assert shape.family == model_type
    # onnxruntime-genai's builder bounds the cache of exactly the layers transformers' layer_types marks sliding.
    sliding = layer_types.count("sliding_attention") if layer_types is not None else 0
    assert shape.window_cache_layers == sliding
    assert shape.sliding_layers >= sliding and (shape.sliding_window > 0) == (shape.sliding_layers > 0)


def test_every_family_is_in_the_matrix() -> None:
    assert {t for t, _ in CASES} == set(FAMILIES)


def test_active_parameters_count_the_routed_experts_only() -> None:
    config = {**BASE, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 1}
    total, active = (parameter_count(shape_from_config(config), active=a) for a in (False, True))
    # 6 layers x 3 unused experts x (gate, up, down) of 64 x 96.
    assert total - active == 6 * 3 * 3 * 64 * 96
    dense = shape_from_config({**BASE, "model_type": "llama"})
    assert parameter_count(dense, active=True) == parameter_count(dense)
