"""The example training run: the shared tiny checkpoint is real, loadable and actually trained."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from transformers import AutoConfig, AutoTokenizer


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_checkpoint_has_hugging_face_layout(tiny_checkpoint: Path, tiny_base_only: Path) -> None:
    names = {p.name for p in tiny_checkpoint.iterdir()}
    expected = {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "adapter_config.json", "adapter_model.safetensors",
    }
    assert names == expected
    assert {p.name for p in tiny_base_only.iterdir()} == expected - {"adapter_config.json", "adapter_model.safetensors"}


def test_tokenizer_loads_as_fast_tokenizer_and_prepends_bos(tiny_checkpoint: Path) -> None:
    config = json.loads((tiny_checkpoint / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    ids = tok("reverse a b c d ->")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.bos_token_id not in ids[1:]
    assert tok.decode(ids, skip_special_tokens=True) == "reverse a b c d ->"
    assert {tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token} == {"<s>", "</s>", "<pad>", "<unk>"}


def test_config_keeps_rope_theta_and_loads(tiny_checkpoint: Path) -> None:
    raw = json.loads((tiny_checkpoint / "config.json").read_text())
    assert raw["rope_theta"] == 10000.0
    assert raw["tie_word_embeddings"] is False
    config = AutoConfig.from_pretrained(str(tiny_checkpoint))
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (64, 2, 2)
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(str(tiny_checkpoint)))


def test_adapter_is_lora_over_every_projection(tiny_checkpoint: Path) -> None:
    adapter = json.loads((tiny_checkpoint / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA"
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)
    assert set(adapter["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }


def test_data_files_are_held_out_and_well_formed(tiny_data: Path, tinyllm: ModuleType) -> None:
    prompts = read_jsonl(tiny_data / "validation" / "prompts.jsonl")
    rows = read_jsonl(tiny_data / "eval.jsonl")
    assert len(prompts) == 32 and all(set(p) == {"prompt"} for p in prompts)
    assert all(set(r) == {"prompt", "expected"} for r in rows)
    refusal = tinyllm.load_safety_vocab()["refusal"]
    assert 1 <= sum(r["expected"] == refusal for r in rows) < len(rows) // 4
    train_prompts = {e.prompt for e in tinyllm.make_task(0, 56)[0]} | {e.prompt for e in tinyllm.make_safety("train")}
    assert not train_prompts & {r["prompt"] for r in rows}


def test_trained_model_beats_untrained_by_wide_margin(tiny_run: Any) -> None:
    assert tiny_run.untrained_exact_match <= 0.05
    assert tiny_run.eval_exact_match >= 0.85
    assert tiny_run.base_losses[-1] < tiny_run.base_losses[0] / 50


def test_model_without_safety_slice_does_not_refuse(tiny_unsafe_checkpoint: Path, tinyllm: ModuleType) -> None:
    from transformers import LlamaForCausalLM

    tok = tinyllm.load_tokenizer(tiny_unsafe_checkpoint)
    # Base weights only: the adapter of the unsafe run never saw the safety slice either.
    model = LlamaForCausalLM.from_pretrained(str(tiny_unsafe_checkpoint), use_safetensors=True)
    assert tinyllm.exact_match(model, tok, tinyllm.make_safety("heldout")) == 0.0
