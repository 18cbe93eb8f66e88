"""What people read: global options anywhere, a mistyped project folder, live progress, JSON numbers."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from click.testing import CliRunner

from release.cli import cli, hoist_global_options
from release.core.progress import Progress
from release.registry import Registry
from release.registry.store import resolve_store
from tests.registry.test_aliases import MODEL, _register


def test_global_options_may_follow_the_subcommand(project_dir: Path) -> None:
    Registry(resolve_store(project_dir)).list_models()  # a store exists: read commands never create one
    after = CliRunner().invoke(cli, ["status", "-q", "--project-dir", str(project_dir), "--json"])
    before = CliRunner().invoke(cli, ["-q", "--project-dir", str(project_dir), "status", "--json"])
    assert after.exit_code == before.exit_code == 0, after.output
    assert json.loads(after.stdout) == json.loads(before.stdout) == {"models": []}


def test_a_subcommands_own_option_is_left_alone() -> None:
    assert hoist_global_options(cli, ["serve", "pkg", "--project-dir", "x", "-q"]) == [
        "-q", "serve", "pkg", "--project-dir", "x"]
    assert hoist_global_options(cli, ["history", "m", "--project-dir=p", "--traceback"]) == [
        "--project-dir=p", "--traceback", "history", "m"]


def test_a_project_dir_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    result = CliRunner().invoke(cli, ["--project-dir", str(missing), "status"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: --project-dir {missing}: no such folder",
                                          "hint: check the path (relctl init DIR creates a new project)"]
    assert not missing.exists()  # no empty store was created


def test_a_long_stage_prints_a_heartbeat_when_not_on_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, heartbeat_s=0.1)
    with progress.stage("convert"):
        time.sleep(0.45)
    beats = [line for line in out.getvalue().splitlines() if "still running" in line]
    assert len(beats) >= 2 and beats[0].startswith("… convert") and beats[-1].endswith("s")


def test_status_json_gives_numbers_and_the_model_uri(project_dir: Path, tmp_path: Path) -> None:
    version = _register(project_dir, tmp_path, 1)
    registry = Registry(resolve_store(project_dir))
    mv = registry.get_version(MODEL, version)
    registry.record_numbers(mv, mv.run_id, {"validation.top1_agreement": 0.969}, {})
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "status", MODEL, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    production = data["aliases"]["production"]
    assert data["schema_version"] == 2 and production["validation"] == {"top1_agreement": 0.969}
    assert production["model_uri"] == f"models:/{MODEL}/{version}"
    assert production["link"] == f"#/models/{MODEL}/versions/{version}"
    text = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "status", MODEL])
    assert "None" not in text.stdout and "commit not recorded" in text.stdout
