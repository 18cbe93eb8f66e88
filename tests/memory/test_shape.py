"""Weights and KV cache of published architectures against the arithmetic from their config.json, and the
builder layout against the initializers of real onnxruntime-genai builds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from release.backends.onnxruntime_genai.plan import Target, breakdown, kv_bytes_per_token
from release.backends.onnxruntime_genai.verdict import load_spec
from release.backends.package_facts import read_package
from release.backends.shape import builder_weights_bytes, parameter_count, shape_from_config
from release.core.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures"
# Published parameter counts (model cards / num_parameters()).
PUBLISHED = {"llama-2-7b": 6_738_415_616, "llama-3-8b": 8_030_261_248, "mistral-7b": 7_241_732_096}


def config(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def int4_linear(k: int, n: int) -> int:
    blocks = math.ceil(k / 32)
    return n * blocks * 16 + n * blocks * 2  # 4-bit weights + one fp16 scale per block of 32


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_weights_and_kv_match_the_config_arithmetic(name: str) -> None:
    c = config(name)
    h, i, v, L = (int(c[k]) for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))  # type: ignore[call-overload]
    heads, kv = int(c["num_attention_heads"]), int(c["num_key_value_heads"])  # type: ignore[call-overload]
    hd, pos = h // heads, int(c["max_position_embeddings"])  # type: ignore[call-overload]
    shape = shape_from_config(c)
    params = L * (h * (heads * hd + 2 * kv * hd) + heads * hd * h + 3 * h * i + 2 * h) + h + 2 * v * h
    assert parameter_count(shape) == params == PUBLISHED[name]
    rope = 2 * pos * (hd // 2) * 2
    assert builder_weights_bytes(shape, "fp16", "cuda") == 2 * params + rope
    assert builder_weights_bytes(shape, "fp32", "cuda") == 4 * params + 2 * rope
    quantized = L * (int4_linear(h, heads * hd + 2 * kv * hd) + int4_linear(heads * hd, h) + 2 * int4_linear(h, i)
                     + int4_linear(i, h) + 2 * h * 2) + h * 2 + int4_linear(h, v) + v * h * 2 + rope
    assert builder_weights_bytes(shape, "int4", "cuda") == quantized
    # KV: 2 (K, V) x layers x kv_heads x head_dim x 2 bytes, for every token of every sequence.
    assert kv_bytes_per_token(shape, 2) == 2 * L * kv * hd * 2
    spec = load_spec(FIXTURES / f"{name}.json", "fp16", "cuda")
    plan = breakdown(spec, Target(memory_gib=80, concurrency=8, context=4096))
    assert plan.kv_cache == 2 * L * kv * hd * 2 * 8 * 4096
    assert plan.weights == 2 * params + rope


def test_known_kv_figures() -> None:
    # The figures people quote: Llama-2-7B 512 KiB per token (MHA), Llama-3-8B and Mistral-7B 128 KiB (GQA 8).
    assert kv_bytes_per_token(shape_from_config(config("llama-2-7b")), 2) == 512 * 1024
    assert kv_bytes_per_token(shape_from_config(config("llama-3-8b")), 2) == 128 * 1024
    assert kv_bytes_per_token(shape_from_config(config("mistral-7b")), 2) == 128 * 1024


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                                   "vocab_size", "max_position_embeddings"])
def test_a_config_missing_a_field_is_refused_by_name(field: str) -> None:
    c = config("llama-3-8b")
    del c[field]
    with pytest.raises(InputError, match=field):
        shape_from_config(c)


def test_inconsistent_heads_are_refused() -> None:
    with pytest.raises(InputError, match="not a multiple"):
        shape_from_config({**config("llama-3-8b"), "num_key_value_heads": 5})


@pytest.mark.parametrize("precision", ["fp32", "int8", "int4"])
def test_builder_layout_equals_the_initializers_of_a_real_build(built: dict[str, Path], precision: str) -> None:
    facts = read_package(built[precision])
    shape = shape_from_config(facts.config)
    assert facts.precision == precision and facts.provider == "cpu" and facts.kv_dtype_bytes == 4
    assert builder_weights_bytes(shape, precision, "cpu") == facts.weights_bytes  # type: ignore[arg-type]
