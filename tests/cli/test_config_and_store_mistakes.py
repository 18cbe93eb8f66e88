"""Mistakes in release.yaml and in the store's address come back all at once and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.config import load_config
from release.core.errors import ConfigError
from release.registry.store import redact_uri

THREE_TYPOS = "convert:\n  precison: int8\nvalidaton:\n  min_top1_agreement: 0.9\nserving:\n  max_batch: 4\n"
RUN_ID = "0123456789abcdef0123456789abcdef"


def test_every_schema_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text(THREE_TYPOS)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = info.value.problems  # type: ignore[attr-defined]
    assert sorted(p[0] for p in problems) == ["release.yaml: unknown key 'convert.precison'",
                                              "release.yaml: unknown key 'serving.max_batch'",
                                              "release.yaml: unknown key 'validaton'"]
    assert "did you mean 'convert.precision'?" in [p[1] for p in problems]
    assert "did you mean 'validation'?" in [p[1] for p in problems]


def test_check_prints_three_typos_in_one_run(project_dir: Path) -> None:
    (project_dir / "release.yaml").write_text(THREE_TYPOS)
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "check", RUN_ID])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    hints = [line for line in result.stderr.splitlines() if line.startswith("hint: ")]
    assert len(errors) == 3 and len(hints) == 3, result.stderr
    assert any("'convert.precison'" in e for e in errors) and any("'validaton'" in e for e in errors)
    assert any("max_batch" in e for e in errors)
    assert not (project_dir / ".relctl" / "mlflow.db").exists()


@pytest.mark.parametrize("command", [("check", RUN_ID), ("status", "tiny-llm"), ("history", "tiny-llm"),
                                     ("trace", "tiny-llm:1")])
def test_a_read_command_with_a_mistyped_store_creates_nothing(project_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              command: tuple[str, str]) -> None:
    typo = tmp_path / "mlfow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{typo}")
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), *command])
    assert result.exit_code == 2, result.output
    assert f"error: MLFLOW_TRACKING_URI sqlite:///{typo} names no existing store ({typo} does not exist)" \
        in result.stderr
    assert "hint: " in result.stderr
    assert not typo.exists() and not (project_dir / ".relctl").exists()


def test_an_absolute_sqlite_path_keeps_its_leading_slash() -> None:
    assert redact_uri("sqlite:////home/me/project/.relctl/mlflow.db") == "sqlite:////home/me/project/.relctl/mlflow.db"
    assert redact_uri("sqlite:///relative.db") == "sqlite:///relative.db"
    assert redact_uri("https://me:secret@mlflow.example.com/x?token=abc") == "https://mlflow.example.com/x?token=%2A%2A%2A"
