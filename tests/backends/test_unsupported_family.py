"""A family no installed backend supports is refused by `relctl check` and by promote's first step, from
config.json alone: exit 2 naming the family and what each backend takes, before any stage or registry write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.registry import Registry
from release.registry.store import resolve_store
from tests.stages.test_promote_errors import log_checkpoint_run


@pytest.fixture(scope="module")
def gpt2_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_base_only: Path) -> Path:
    """A tiny GPT-2 (a family onnxruntime-genai's builder does not export) with the example's tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("gpt2") / "checkpoint"
    vocab = json.loads((tiny_base_only / "config.json").read_text())["vocab_size"]
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128)).save_pretrained(
        str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tiny_base_only / name, folder / name)
    return folder


@pytest.mark.parametrize("command", ["check", "promote"])
def test_unsupported_family_is_refused_before_any_stage(tmp_path: Path, gpt2_checkpoint: Path, command: str) -> None:
    run_id = log_checkpoint_run(tmp_path, gpt2_checkpoint)
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), command, run_id])
    assert result.exit_code == 2, result.output + result.stderr
    error = next(line for line in result.stderr.splitlines() if "GPT2LMHeadModel" in line)
    assert "not supported by any installed backend" in error and "onnxruntime-genai:" in error
    hint = result.stderr.strip().splitlines()[-1]
    # What each installed backend supports, so the user knows where such a model could go.
    assert hint.startswith("hint: ") and "Llama" in hint and "fp32, fp16, int8, int4" in hint
    # Found from config.json alone: no stage folder, no release run, no registered model.
    assert not (tmp_path / ".relctl" / "work").exists()
    registry = Registry(resolve_store(tmp_path))
    assert registry.list_models() == []
    assert "relctl-releases" not in [e.name for e in registry.client.search_experiments()]


def test_a_backend_named_in_release_yaml_that_is_not_installed(tmp_path: Path, tiny_base_only: Path) -> None:
    run_id = log_checkpoint_run(tmp_path, tiny_base_only)
    (tmp_path / "release.yaml").write_text("convert:\n  backend: tensorrt-llm\n")
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "check", run_id])
    assert result.exit_code == 2
    assert "convert.backend" in result.stderr
    assert "'tensorrt-llm' is not offered by the installed backends" in result.stderr
