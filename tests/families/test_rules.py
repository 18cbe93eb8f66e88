"""release/families.py on published configs (as their config.json files say, transformers 4 and 5 shapes):
what the builder takes, what it is refused with, and the restated config it is given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from release.backends.onnxruntime_genai.families import builder_config, genai_config_problems
from release.lora.base_name import NameCheck, check_base_names

LLAMA_32_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_attention_heads": 32, "head_dim": 64,
    "num_hidden_layers": 16, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
PHI_35_MINI: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.5] * 48},
}
GEMMA3_1B_V5: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152, "num_attention_heads": 4, "head_dim": 256,
    "num_hidden_layers": 26, "max_position_embeddings": 32768, "sliding_window": 512,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
}
SMOLLM3_3B: dict[str, Any] = {
    "architectures": ["SmolLM3ForCausalLM"], "hidden_size": 2048, "num_attention_heads": 16,
    "num_hidden_layers": 36, "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(36)],
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
}
PHI_2: dict[str, Any] = {
    "architectures": ["PhiForCausalLM"], "hidden_size": 2560, "num_attention_heads": 32, "num_hidden_layers": 32,
    "partial_rotary_factor": 0.4,
}


@pytest.mark.parametrize("config", [LLAMA_32_1B, PHI_35_MINI, GEMMA3_1B_V5, PHI_2],
                         ids=["llama-3.2-1b", "phi-3.5-mini", "gemma-3-1b", "phi-2"])
def test_published_configs_the_builder_takes(config: dict[str, Any]) -> None:
    assert genai_config_problems(config) == []


@pytest.mark.parametrize("config,reason", [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "architecture 'GPT2LMHeadModel' is not one"),
    (SMOLLM3_3B, "no_rope_layers is 0 at [3, 7, 11"),
    ({**LLAMA_32_1B, "rope_scaling": {"type": "linear", "factor": 4.0}}, "rope type 'linear' on LlamaForCausalLM"),
    ({**LLAMA_32_1B, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
    ({**PHI_2, "partial_rotary_factor": 0.5}, "rotary dimensions 40"),
    ({**PHI_35_MINI, "max_position_embeddings": 2048}, "max_position_embeddings 2048 not above"),
    ({**PHI_35_MINI, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 47, "long_factor": [1.0] * 48}},
     "short_factor: 48 values needed"),
    ({"architectures": ["OlmoForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32, "clip_qkv": 8.0},
     "clip_qkv 8.0"),
    ({**GEMMA3_1B_V5, "rope_parameters": {**GEMMA3_1B_V5["rope_parameters"],
                                          "full_attention": {"rope_type": "linear", "factor": 8.0}}},
     "rope_parameters.full_attention 'linear'"),
], ids=["gpt2", "smollm3-nope", "llama-linear", "llama-dynamic", "phi-2-rotary", "phi3-short-longrope",
        "phi3-factors", "olmo-clip", "gemma3-linear"])
def test_configs_the_builder_cannot_take_say_why(config: dict[str, Any], reason: str) -> None:
    problems = genai_config_problems(config)
    assert any(reason in p for p in problems), problems


def test_builder_config_restates_only_what_the_builder_misreads() -> None:
    assert builder_config(LLAMA_32_1B) == LLAMA_32_1B and builder_config(PHI_35_MINI) == PHI_35_MINI
    short_phi3 = {"architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 2048,
                  "original_max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default"}}
    assert builder_config(short_phi3)["original_max_position_embeddings"] == 2048
    assert short_phi3["original_max_position_embeddings"] == 4096  # the input is not changed
    rope = builder_config(GEMMA3_1B_V5)["rope_parameters"]
    assert (rope["rope_type"], rope["rope_theta"], rope["rope_local_base_freq"]) == ("default", 1000000.0, 10000.0)
    assert rope["sliding_attention"] == GEMMA3_1B_V5["rope_parameters"]["sliding_attention"]


@pytest.mark.parametrize("adapter,base,error,warning", [
    ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B", False, False),
    ("Qwen2.5-0.5B", "qwen/qwen2.5-0.5b", False, False),
    ("Qwen/Qwen2.5-0.5B", "google/gemma-2-2b", True, False),
    ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct", True, False),
    ("/home/me/models/base", "google/gemma-2-2b", False, True),
    (None, "google/gemma-2-2b", False, True),
    ("Qwen/Qwen2.5-0.5B", "", False, True),
])
def test_base_names(adapter: str | None, base: str, error: bool, warning: bool) -> None:
    check = check_base_names({"base_model_name_or_path": adapter}, {"_name_or_path": base})
    assert (check.error is not None, check.warning is not None) == (error, warning)
    if error:
        assert f"'{adapter}'" in str(check.error) and f"'{base}'" in str(check.error)


def test_the_example_names_its_base_on_both_sides(tiny_checkpoint: Path) -> None:
    """The flagship example is checked, not waved through: its adapter and base record the same name, so
    a newcomer's first promote neither warns that names were not compared nor skips the check."""
    adapter = json.loads((tiny_checkpoint / "adapter_config.json").read_text())
    base = json.loads((tiny_checkpoint / "config.json").read_text())
    assert check_base_names(adapter, base) == NameCheck()
    assert check_base_names(adapter, {**base, "_name_or_path": "google/gemma-2-2b"}).error is not None
