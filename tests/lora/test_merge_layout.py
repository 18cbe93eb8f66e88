"""The merged checkpoint's layout: shards, index, side files, and nothing half-written on interruption."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from release.core.checkpoint import read_header
from release.core.errors import InputError
from release.stages.merge import merge_checkpoint
from tests.lora.helpers import (
    LLAMA_TARGETS,
    assert_same_as_peft,
    llama_config,
    peft_merged,
    read_checkpoint,
    save_adapter,
    save_base,
    write_tokenizer,
)

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sharded")
    base = save_base(root / "base", llama_config(hidden=48, layers=3), torch.bfloat16, max_shard_size="40KB")
    adapter = save_adapter(base, root / "adapter", LoraConfig(r=4, lora_alpha=8, target_modules=LLAMA_TARGETS,
                                                               use_dora=True), torch.bfloat16)
    return base, adapter


def test_sharded_base_gives_same_shards_and_a_correct_index(sharded: tuple[Path, Path], tmp_path: Path) -> None:
    base, adapter = sharded
    shards = sorted(p.name for p in base.glob("model-*.safetensors"))
    assert len(shards) >= 3

    report = merge_checkpoint(base, adapter, tmp_path / "out")

    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    index = json.loads((out / INDEX).read_text())
    for name in shards:
        header = read_header(out / name)
        assert header.tensors.keys() == read_header(base / name).tensors.keys()
        assert all(index["weight_map"][t] == name for t in header.tensors)
    assert set(index["weight_map"]) == set(read_checkpoint(out))
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in read_checkpoint(out).values())
    assert_same_as_peft(read_checkpoint(out), peft_merged(base, adapter, torch.bfloat16))
    assert report.output_files == sorted(p.name for p in out.iterdir())
    assert report.bytes_written == sum(p.stat().st_size for p in out.iterdir())


def test_output_loads_with_transformers_and_holds_no_adapter_files(sharded: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    base, adapter = sharded
    merge_checkpoint(base, adapter, tmp_path / "out")
    out = tmp_path / "out"

    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", INDEX} <= names
    assert not names & {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    assert not list(tmp_path.glob(".*partial*"))
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[1, 5, 9, 3]])
    reference = AutoModelForCausalLM.from_pretrained(base)
    assert not torch.equal(model(ids).logits, reference(ids).logits)


def test_adapter_in_the_base_folder_and_its_tokenizer(tmp_path: Path) -> None:
    folder = save_base(tmp_path / "run", llama_config(), torch.float16)
    adapter = save_adapter(folder, tmp_path / "adapter", LoraConfig(r=4, target_modules=["q_proj"]), torch.float16)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(adapter / name, folder / name)

    report = merge_checkpoint(folder, folder, tmp_path / "out")

    assert "adapter_model.safetensors" not in report.output_files
    assert_same_as_peft(read_checkpoint(tmp_path / "out"), peft_merged(folder, adapter, torch.float16))
    assert report.tokenizer_from == "base"


def test_tokenizer_saved_with_the_adapter_wins(tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", llama_config())
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(r=4, target_modules=["v_proj"]))
    write_tokenizer(adapter, marker="trained")

    report = merge_checkpoint(base, adapter, tmp_path / "out")

    assert report.tokenizer_from == "adapter"
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["marker"] == "trained"
    assert (tmp_path / "out" / "config.json").read_bytes() == (base / "config.json").read_bytes()


def test_interrupted_merge_leaves_nothing(sharded: tuple[Path, Path], tmp_path: Path) -> None:
    base, adapter = sharded
    seen: list[tuple[int, int]] = []

    def interrupt(done: int, total: int) -> None:
        seen.append((done, total))
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        merge_checkpoint(base, adapter, tmp_path / "out", progress=interrupt)

    assert seen and seen[-1][0] <= seen[-1][1]
    assert list(tmp_path.iterdir()) == []


def test_progress_reaches_the_total(sharded: tuple[Path, Path], tmp_path: Path) -> None:
    base, adapter = sharded
    seen: list[tuple[int, int]] = []

    merge_checkpoint(base, adapter, tmp_path / "out", progress=lambda d, t: seen.append((d, t)))

    done = [d for d, _ in seen]
    assert done == sorted(done)
    assert seen[-1] == (sum(p.stat().st_size for p in base.glob("*.safetensors")),) * 2


def test_existing_output_folder_is_refused(sharded: tuple[Path, Path], tmp_path: Path) -> None:
    base, adapter = sharded
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("someone's file")

    with pytest.raises(InputError, match="already exists"):
        merge_checkpoint(base, adapter, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
