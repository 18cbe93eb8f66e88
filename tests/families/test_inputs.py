"""Inputs beside the matrix's fp32 single-file checkpoints: sharded bf16 and fp16 bases, and the Phi-3 config
transformers' Phi3Config gives a small context (max_position_embeddings below original_max_position_embeddings,
which the builder alone crashes on), each merged like peft and released end to end at fp32."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from release.cli import cli
from release.stages.merge import merge_checkpoint
from tests.families.conftest import Built, Shared, log_family_run
from tests.lora.helpers import assert_same_as_peft, peft_merged, read_checkpoint

pytestmark = pytest.mark.slow


def resave(built: Built, out: Path, dtype: torch.dtype, shard: str | None) -> Path:
    """The family's trained base saved again in `dtype` (sharded at `shard`), with its tokenizer."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(built.base, dtype=torch.float32).to(dtype)
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(built.base / name, out / name)
    return out


def release_fp32(project: Path, checkpoint: Path, data: Path, name: str) -> dict[str, object]:
    run_id = log_family_run(project, checkpoint, data, experiment=name)
    result = CliRunner().invoke(cli, ["--project-dir", str(project), "promote", run_id, "--precision", "fp32",
                                      "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    assert report["outcome"] == "released"
    return report


@pytest.mark.parametrize("name,dtype,shard", [
    ("qwen2", torch.bfloat16, "400KB"),
    ("llama", torch.float16, None),
], ids=["qwen2-bf16-sharded", "llama-fp16"])
def test_half_precision_and_sharded_bases(name: str, dtype: torch.dtype, shard: str | None,
                                          family_checkpoint: Callable[[str], Built], family_shared: Shared,
                                          tmp_path: Path) -> None:
    built = family_checkpoint(name)
    base = resave(built, tmp_path / "base", dtype, shard)
    assert (base / "model.safetensors.index.json").is_file() == (shard is not None)
    merged = tmp_path / "merged"
    merge_checkpoint(base, built.adapter, merged)
    if shard:  # the merge keeps the base's shards and index
        shards = sorted(p.name for p in base.glob("*.safetensors"))
        assert sorted(p.name for p in merged.glob("*.safetensors")) == shards and len(shards) > 1
    assert_same_as_peft(read_checkpoint(merged), peft_merged(base, built.adapter, dtype))
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(base, checkpoint)
    for path in built.adapter.iterdir():
        shutil.copy(path, checkpoint / path.name)
    project = tmp_path / "project"
    project.mkdir()
    report = release_fp32(project, checkpoint, family_shared.data_dir, name)
    assert report["validation"]["passed"] is True  # type: ignore[index]


def test_phi3_with_a_context_below_its_original_releases(family_checkpoint: Callable[[str], Built],
                                                         family_shared: Shared, tmp_path: Path) -> None:
    built = family_checkpoint("phi3")
    checkpoint = shutil.copytree(built.checkpoint, tmp_path / "checkpoint")
    config = json.loads((checkpoint / "config.json").read_text())
    # What Phi3Config(max_position_embeddings=2048) writes: original_max_position_embeddings stays 4096.
    config.update(max_position_embeddings=2048, original_max_position_embeddings=4096)
    (checkpoint / "config.json").write_text(json.dumps(config))
    project = tmp_path / "project"
    project.mkdir()
    report = release_fp32(project, checkpoint, family_shared.data_dir, "phi3")
    assert report["validation"]["passed"] is True  # type: ignore[index]
