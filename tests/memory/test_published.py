"""`relctl plan` on published configs (tests/memory/fixtures: the Hugging Face config.json files as
published): the parameter counts as published, KV bytes per token by the standard formula (MLA's latent,
window-bounded sliding layers capped at the window), a context past the model's maximum refused, and an
architecture the plan does not know refused as unsupported instead of planned as a plain decoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from release.backends.onnxruntime_genai.plan import breakdown
from release.backends.onnxruntime_genai.verdict import load_spec
from release.backends.planning import Target, kv_bytes_per_sequence, kv_bytes_per_token
from release.backends.shape import parameter_count, shape_from_config
from release.cli import cli
from release.core.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures"
# Published exact counts (model cards, `model.num_parameters()`).
PUBLISHED = {
    "qwen2.5-7b": 7_615_616_512, "qwen2.5-0.5b": 494_032_768, "llama-3-8b": 8_030_261_248,
    "mixtral-8x7b": 46_702_792_704, "deepseek-v2-lite": 15_706_484_224, "gemma-2-9b": 9_241_705_984,
    "mistral-7b": 7_241_732_096,
}
# KV bytes per token at 2 bytes (bf16/fp16): 2 x layers x kv_heads x head_dim x 2; MLA: layers x (512 + 64) x 2.
KV = {
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2, "qwen2.5-0.5b": 2 * 24 * 2 * 64 * 2, "llama-3-8b": 2 * 32 * 8 * 128 * 2,
    "mixtral-8x7b": 2 * 32 * 8 * 128 * 2, "deepseek-v2-lite": 27 * (512 + 64) * 2,
    "gemma-2-9b": 2 * 42 * 8 * 256 * 2, "mistral-7b": 2 * 32 * 8 * 128 * 2,
}


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def plan(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["plan", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_figures_people_quote() -> None:
    assert KV["deepseek-v2-lite"] == 31_104 and KV["llama-3-8b"] == 128 * 1024 and KV["gemma-2-9b"] == 336 * 1024
    assert KV["qwen2.5-7b"] == 56 * 1024


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_relctl_plan_reports_the_published_parameters_and_kv(name: str, tmp_path: Path) -> None:
    code, out, _ = plan(str(FIXTURES / f"{name}.json"), "--memory-gib", "640", "--provider", "cuda",
                        "--concurrency", "1",
                        "--context", "1024", "--precision", "fp16", "--json")
    data = json.loads(out)
    assert code == 0 and data["model"]["parameters"] == PUBLISHED[name]
    assert data["breakdown"]["kv_bytes_per_token"] == KV[name]
    assert data["breakdown"]["kv_cache"] == KV[name] * 1024  # within every window: all layers, every token


def test_mixtral_holds_every_expert_and_computes_with_two() -> None:
    c = config("mixtral-8x7b")
    h, i, v, layers, experts = 4096, 14336, 32000, 32, 8
    attention = h * (4096 + 2 * 1024) + 4096 * h
    per_layer = attention + experts * 3 * h * i + h * experts + 2 * h  # experts, router, two norms
    assert parameter_count(shape_from_config(c)) == layers * per_layer + h + 2 * v * h == 46_702_792_704
    active = layers * (attention + 2 * 3 * h * i + h * experts + 2 * h) + h + 2 * v * h
    assert parameter_count(shape_from_config(c), active=True) == active == 12_879_925_248  # "12.9B active"
    # All 46.7B parameters are held: 87 GiB at fp16 does not fit one H100 (it once said "fits, 19 sequences").
    code, out, _ = plan(str(FIXTURES / "mixtral-8x7b.json"), "--gpu", "H100-80GB", "--concurrency", "8",
                        "--context", "4096", "--precision", "fp16", "--json")
    data = json.loads(out)
    assert code == 1 and not data["fits"] and data["breakdown"]["weights"] > 2 * 46_702_792_704
    assert data["model"]["active_parameters"] == 12_879_925_248


def test_deepseek_v2_lite_latent_attention_and_experts() -> None:
    shape = shape_from_config(config("deepseek-v2-lite"))
    h, layers, heads, v = 2048, 27, 16, 102400
    attention = (h * heads * (128 + 64) + h * (512 + 64) + 512 + 512 * heads * (128 + 128) + heads * 128 * h)
    dense = 3 * h * 10944
    moe = 64 * 3 * h * 1408 + h * 64 + 3 * h * 2 * 1408  # 64 routed experts, router, 2 shared experts
    expected = layers * (attention + 2 * h) + dense + (layers - 1) * moe + h + 2 * v * h
    assert parameter_count(shape) == expected == 15_706_484_224
    assert (shape.kv_lora_rank, shape.qk_rope_head_dim, shape.moe_layers) == (512, 64, 26)
    b = breakdown(load_spec(FIXTURES / "deepseek-v2-lite.json", "fp16", "cuda"),
                  Target(memory_gib=80, concurrency=4, context=32768))
    assert b.kv_cache == 27 * 576 * 2 * 4 * 32768  # not 2 x 27 x 16 x 128 x 2 = 221,184 bytes per token


def test_sliding_window_layers_hold_at_most_the_window() -> None:
    gemma = shape_from_config(config("gemma-2-9b"))
    assert (gemma.window_cache_layers, gemma.sliding_window, gemma.tied_embeddings) == (21, 4096, True)
    per_layer_token = 2 * 8 * 256 * 2
    assert kv_bytes_per_sequence(gemma, 2, 8192) == per_layer_token * (21 * 8192 + 21 * 4096)
    assert kv_bytes_per_sequence(gemma, 2, 1000) == 42 * per_layer_token * 1000
    # Mistral's sliding_window 4096 limits every layer's attention, but with no layer_types the builder
    # allocates every layer's cache at the full context: capping it would plan less than is allocated.
    mistral = shape_from_config(config("mistral-7b"))
    assert (mistral.sliding_layers, mistral.window_cache_layers) == (32, 0)
    assert kv_bytes_per_sequence(mistral, 2, 32768) == 2 * 32 * 8 * 128 * 2 * 32768
    out = plan(str(FIXTURES / "mistral-7b.json"), "--gpu", "H100-80GB", "--concurrency", "1", "--context", "8192",
               "--precision", "fp16")[1]
    assert "attention slides over 4,096 tokens but the cache holds the whole context" in out
    code, out, _ = plan(str(FIXTURES / "gemma-2-9b.json"), "--gpu", "H100-80GB", "--concurrency", "2",
                        "--context", "8192", "--precision", "fp16")
    assert code == 0 and "21 of 42 layers cache at most 4,096 tokens (172,032 bytes/token beyond them)" in out
    assert "gemma2, 9,241,705,984 parameters; KV 344,064 bytes/token" in out


def test_qwen2_counts_its_qkv_biases() -> None:
    shape = shape_from_config(config("qwen2.5-7b"))
    assert shape.qkv_bias and not shape.attention_bias
    without = parameter_count(shape) - 28 * (3584 + 2 * 512)
    assert without == 7_615_487_488  # the count that missed them


def test_a_context_beyond_the_model_maximum_is_refused() -> None:
    code, out, err = plan(str(FIXTURES / "llama-3-8b.json"), "--gpu", "H100-80GB", "--concurrency", "1",
                          "--context", "65536")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 2
    assert lines[0] == "error: --context: 65536 tokens is beyond the model's max_position_embeddings 8192"
    assert lines[1].startswith("hint: ") and "8192" in lines[1]
    assert plan(str(FIXTURES / "llama-3-8b.json"), "--gpu", "H100-80GB", "--concurrency", "1",
                "--context", "8192")[0] == 0


JAMBA = {"model_type": "jamba", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 65536, "max_position_embeddings": 262144,
         "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16, "num_experts": 16}
LLAMA3 = config("llama-3-8b")


@pytest.mark.parametrize(("case", "reason"), [
    (JAMBA, "model_type 'jamba'"),
    ({**LLAMA3, "num_local_experts": 8, "num_experts_per_tok": 2},
     "'num_local_experts' (mixture of experts) in a llama"),
    ({**LLAMA3, "model_type": "mistral", "attn_layer_period": 4}, "'attn_layer_period' (a hybrid of attention and SSM"),
    ({**LLAMA3, "model_type": "qwen2", "layer_types": ["linear_attention"] * 32}, "layer_types 'linear_attention'"),
    ({k: v for k, v in LLAMA3.items() if k != "model_type"}, "no model_type"),
    ({**config("deepseek-v2-lite"), "moe_layer_freq": 2}, "moe_layer_freq 2"),
], ids=["hybrid-ssm", "llama-with-experts", "mistral-hybrid", "linear-attention", "no-model-type", "moe-freq"])
def test_an_architecture_the_plan_does_not_know_is_unsupported(tmp_path: Path, case: dict[str, Any],
                                                               reason: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(case))
    code, out, err = plan(str(path), "--gpu", "H100-80GB", "--concurrency", "1", "--context", "1024")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 2
    assert lines[0].startswith("error: config.json: unsupported architecture: ") and reason in lines[0]
    assert lines[1].startswith("hint: the memory plan knows ") and "deepseek_v2" in lines[1]
    # every engine's plan reads the shape first, so each refuses it, before any figure is written.
    with pytest.raises(InputError, match="unsupported architecture"):
        shape_from_config(case)


def test_the_shared_kv_arithmetic_knows_mla_and_windows() -> None:
    assert kv_bytes_per_token(shape_from_config(config("deepseek-v2-lite")), 2) == 31_104
    gemma = shape_from_config(config("gemma-2-9b"))
    assert kv_bytes_per_token(gemma, 2) == 344_064
    assert kv_bytes_per_sequence(gemma, 2, 8192) * 2 == 2 * 8 * 256 * 2 * (21 * 8192 + 21 * 4096) * 2
