"""Bad input to `relctl promote`: one error line, a hint, exit 2, and nothing in the registry."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.registry import Registry
from release.registry.store import connect, ensure_experiment, resolve_store

pytestmark = pytest.mark.slow


def log_checkpoint_run(project: Path, checkpoint: Path, prompts: bool = True) -> str:
    """A training run that logged `checkpoint` the way the example does (artifact path checkpoint/), and
    validation prompts unless `prompts` is False, so each case breaks exactly one thing."""
    store = resolve_store(project)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, "bad-input")) as run:
        if checkpoint.exists():
            mlflow.log_artifacts(str(checkpoint), "checkpoint")
        if prompts:
            mlflow.log_text('{"prompt": "reverse a b c d ->"}\n', "validation/prompts.jsonl")
    return str(run.info.run_id)


def promote(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), "promote", *args])


def assert_refused(result: Result, project: Path, message: str) -> None:
    assert result.exit_code == 2, result.output + result.stderr
    # Progress lines of the stages that finished may come first; the error is the last two lines.
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error: ")] == [lines[-2]], lines
    assert message in lines[-2] and lines[-1].startswith("hint: "), lines
    assert Registry(resolve_store(project)).list_models() == []


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


def _wrong_adapter_shape(folder: Path) -> None:
    from safetensors.numpy import load_file, save_file

    path = folder / "adapter_model.safetensors"
    tensors = load_file(str(path))
    name = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[name] = tensors[name][:, :-8].copy()  # rank x (hidden - 8): trained for another base
    save_file(tensors, str(path))


def _unsupported_adapter(folder: Path) -> None:
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["peft_type"] = "IA3"
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing config.json": (lambda f: (f / "config.json").unlink(), "config.json is missing"),
    "truncated safetensors": (_truncate, "model.safetensors: tensor"),
    "pickle checkpoint": (lambda f: (f / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01."),
                          "pickle checkpoint files are not accepted"),
    "pt checkpoint": (lambda f: (f / "model.pt").write_bytes(b"\x80\x04K\x01."),
                      "pickle checkpoint files are not accepted"),
    "adapter shape": (_wrong_adapter_shape, "base weight needs"),
    "unsupported adapter": (_unsupported_adapter, "IA3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_is_refused(case: str, project_dir: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    breaker, message = CASES[case]
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, folder)
    breaker(folder)
    run_id = log_checkpoint_run(project_dir, folder)
    assert_refused(promote(project_dir, run_id), project_dir, message)


def test_unknown_run_id(project_dir: Path) -> None:
    assert_refused(promote(project_dir, "0123456789abcdef0123456789abcdef"), project_dir, "not found")


def test_run_without_checkpoint(project_dir: Path, tmp_path: Path) -> None:
    run_id = log_checkpoint_run(project_dir, tmp_path / "nothing")
    assert_refused(promote(project_dir, run_id), project_dir, "has no checkpoint at artifact path 'checkpoint/'")


def test_unknown_release_yaml_key(project_dir: Path) -> None:
    (project_dir / "release.yaml").write_text("validation:\n  min_top1_agreemnt: 0.9\n")
    result = promote(project_dir, "0123456789abcdef0123456789abcdef")
    assert_refused(result, project_dir, "unknown key 'validation.min_top1_agreemnt'")
    assert "did you mean 'validation.min_top1_agreement'?" in result.stderr


def test_a_run_with_only_a_checkpoint_lists_every_missing_piece_at_once(project_dir: Path, tiny_checkpoint: Path,
                                                                       tmp_path: Path) -> None:
    import time

    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "tokenizer.json").unlink()
    run_id = log_checkpoint_run(project_dir, folder, prompts=False)
    (project_dir / "release.yaml").write_text("gates:\n  eval: {thresholds: {exact_match: {threshold: 0.0}}}\n")
    started = time.monotonic()
    result = promote(project_dir, run_id)
    assert time.monotonic() - started < 5 + 10  # 5 s on an idle machine; the suite's neighbours get slack
    assert result.exit_code == 2, result.output + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    hints = [line for line in result.stderr.splitlines() if line.startswith("hint: ")]
    assert len(errors) == 3 == len(hints), result.stderr
    assert any("tokenizer.json is missing" in e for e in errors)
    assert any("no validation prompts" in e for e in errors)
    assert any("needs an eval set" in e for e in errors)
    assert not (project_dir / ".relctl" / "work").exists()  # no stage started
    check = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "check", run_id])
    assert check.exit_code == 2
    assert [line for line in check.stderr.splitlines() if line.startswith(("error: ", "hint: "))] == [
        line for line in result.stderr.splitlines() if line.startswith(("error: ", "hint: "))]
    assert Registry(resolve_store(project_dir)).list_models() == []
