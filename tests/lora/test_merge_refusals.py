"""What the merge refuses: one InputError line (exit code 2) naming the problem, a hint, nothing written."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import IA3Config, LoHaConfig, LoraConfig, PeftConfig, PrefixTuningConfig, TaskType
from safetensors.torch import save_file

from release.core.errors import EXIT_BAD_INPUT, InputError
from release.stages.merge import merge_checkpoint
from tests.lora.helpers import LLAMA_TARGETS, llama_config, save_adapter, save_base

SHAPE_HINT = "the adapter was trained for a different base model; check base_model_name_or_path"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_base(tmp_path_factory.mktemp("refusals") / "base", llama_config())


def _refused(base: Path, adapter: Path, out: Path) -> InputError:
    with pytest.raises(InputError) as caught:
        merge_checkpoint(base, adapter, out)
    err = caught.value
    assert err.exit_code == EXIT_BAD_INPUT
    assert "\n" not in err.message and err.hint and "\n" not in err.hint
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
    return err


def _edit_config(adapter: Path, **changes: object) -> Path:
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return adapter


@pytest.mark.parametrize("config", [
    IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
    LoHaConfig(r=4, target_modules=["q_proj"]),
    PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4),
], ids=["IA3", "LOHA", "PREFIX_TUNING"])
def test_other_adapter_types_are_refused(base: Path, tmp_path: Path, config: PeftConfig) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", config)
    err = _refused(base, adapter, tmp_path / "out")
    assert re.fullmatch(r"adapter_config\.json: peft_type '\w+' is not supported; relctl merges LORA adapters",
                        err.message)
    assert str(config.peft_type.value) in err.message


def test_layer_replication_is_refused(base: Path, tmp_path: Path) -> None:
    config = LoraConfig(r=4, target_modules=["q_proj"], layer_replication=[[0, 2], [1, 2]])
    adapter = save_adapter(base, tmp_path / "adapter", config)
    assert "layer_replication" in _refused(base, adapter, tmp_path / "out").message


def test_pissa_init_is_refused(base: Path, tmp_path: Path) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"],
                                                                  init_lora_weights="pissa"))
    err = _refused(base, adapter, tmp_path / "out")
    assert "init_lora_weights='pissa'" in err.message and "path_initial_model_for_weight_conversion" in err.hint


@pytest.mark.parametrize("option,value", [
    ("megatron_config", {"tensor_model_parallel_size": 2}),
    ("trainable_token_indices", [3, 4]),
    ("use_qalora", True),
    ("a_future_peft_option", True),
])
def test_unsupported_or_unknown_options_are_refused(base: Path, tmp_path: Path, option: str, value: object) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]))
    assert option in _refused(base, _edit_config(adapter, **{option: value}), tmp_path / "out").message


def test_lora_bias_without_a_base_bias_is_refused(base: Path, tmp_path: Path) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"], lora_bias=True))
    assert "base layer has no bias" in _refused(base, adapter, tmp_path / "out").message


def test_adapter_for_a_wider_model_names_tensor_and_shapes(base: Path, tmp_path: Path) -> None:
    other = save_base(tmp_path / "other", llama_config(hidden=48))
    adapter = save_adapter(other, tmp_path / "adapter", LoraConfig(r=8, target_modules=LLAMA_TARGETS))
    err = _refused(base, adapter, tmp_path / "out")
    assert err.message == ("adapter_model.safetensors: tensor 'model.layers.0.mlp.down_proj.lora_A' has shape "
                           "(8, 64), base weight needs (8, 48)")
    assert err.hint == SHAPE_HINT


def test_rank_that_disagrees_with_rank_pattern_is_refused(base: Path, tmp_path: Path) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["v_proj"]))
    err = _refused(base, _edit_config(adapter, rank_pattern={"v_proj": 2}), tmp_path / "out")
    assert "'model.layers.0.self_attn.v_proj.lora_A' has shape (4, 32), base weight needs (2, 32)" in err.message


def test_adapter_keys_that_match_no_base_tensor_are_refused(base: Path, tmp_path: Path) -> None:
    deeper = save_base(tmp_path / "deeper", llama_config(layers=3))
    adapter = save_adapter(deeper, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]))
    err = _refused(base, adapter, tmp_path / "out")
    assert err.message == ("adapter_model.safetensors: tensor 'base_model.model.model.layers.2.self_attn.q_proj"
                           ".lora_A.weight' matches no base tensor "
                           "(looked for 'model.layers.2.self_attn.q_proj.weight')")
    assert err.hint == SHAPE_HINT


def test_unknown_adapter_tensor_is_refused(base: Path, tmp_path: Path) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_E": torch.zeros(4)},
              adapter / "adapter_model.safetensors")
    assert "lora_E" in _refused(base, adapter, tmp_path / "out").message


def _with_pickle(folder: Path) -> None:
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")


def _without_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def _truncated(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


@pytest.mark.parametrize("damage,expected", [
    (_with_pickle, "pickle checkpoint files are not accepted"),
    (_without_config, "config.json is missing"),
    (_truncated, "truncated?"),
], ids=["pickle", "no-config", "truncated"])
def test_broken_base_is_refused(base: Path, tmp_path: Path, damage: Callable[[Path], None], expected: str) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]))
    broken = save_base(tmp_path / "broken", llama_config())
    damage(broken)
    assert expected in _refused(broken, adapter, tmp_path / "out").message


def test_pickled_adapter_is_refused(base: Path, tmp_path: Path) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]))
    (adapter / "adapter_model.safetensors").unlink()
    torch.save({}, adapter / "adapter_model.bin")
    assert "adapter_model.bin" in _refused(base, adapter, tmp_path / "out").message


def test_missing_adapter_config_is_refused(base: Path, tmp_path: Path) -> None:
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]))
    (adapter / "adapter_config.json").unlink()
    assert "adapter_config.json is missing" in _refused(base, adapter, tmp_path / "out").message
