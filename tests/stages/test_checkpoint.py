"""Intake's checks read headers only: broken or hostile checkpoints are refused before any loader runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from release.core import checkpoint as ckpt
from release.core.errors import InputError
from release.stages.intake import check_checkpoint


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": 8,
        "num_attention_heads": 2, "vocab_size": 4}))
    save_file({"a.weight": np.ones((4, 8), np.float32), "b.weight": np.zeros((8,), np.float16)},
              str(root / "model.safetensors"))
    return root


def test_headers_are_read_without_loading(folder: Path) -> None:
    header = ckpt.read_header(folder / "model.safetensors")
    assert header.tensors["a.weight"].shape == (4, 8)
    assert header.tensors["a.weight"].nbytes == 4 * 8 * 4
    assert header.tensors["b.weight"].dtype == "F16"
    summary = check_checkpoint(folder)
    assert summary["tensors"] == 2 and summary["adapter"] is None


def test_truncated_safetensors_is_refused(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(InputError, match=r"model.safetensors: tensor '.*' ends at byte \d+ but the file has"):
        check_checkpoint(folder)


def test_garbage_header_is_refused(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match="header length"):
        check_checkpoint(folder)


def test_missing_config_is_refused_never_defaulted(folder: Path) -> None:
    (folder / "config.json").unlink()
    with pytest.raises(InputError, match=r"config\.json is missing") as info:
        check_checkpoint(folder)
    assert info.value.hint and "config.json" in info.value.hint


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "training_args.pth"])
def test_pickle_checkpoints_are_refused(folder: Path, name: str) -> None:
    # Content that would run code if unpickled: relctl must refuse by name, never open it.
    (folder / name).write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(InputError, match="pickle checkpoint files are not accepted"):
        check_checkpoint(folder)


def test_sharded_index_must_match_shards(folder: Path) -> None:
    shutil.move(folder / "model.safetensors", folder / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00001.safetensors",
                                            "c.weight": "model-00001-of-00001.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"tensor 'c\.weight' is mapped to"):
        check_checkpoint(folder)
    index["weight_map"] = {"a.weight": "model-00001-of-00001.safetensors", "b.weight": "model-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match=r"lists shard model-00002\.safetensors"):
        check_checkpoint(folder)


def test_adapter_without_weights_is_refused(folder: Path) -> None:
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    with pytest.raises(InputError, match=r"no adapter_model\.safetensors"):
        check_checkpoint(folder)
