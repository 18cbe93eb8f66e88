"""Alias moves under crashes and races: killed mid-move, two rollbacks at once, a rewritten package.

Each crash test pauses a real `relctl` process at a named point (release/core/faults.py), SIGKILLs it
there, and checks what the next command finds and repairs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from release.cli import cli
from release.commands import api
from release.registry import Registry
from release.registry import tags as T
from release.registry.aliases import read_history
from release.registry.store import resolve_store
from tests.registry.test_aliases import MODEL, _register

RELCTL = [sys.executable, "-c", "from release.cli import main; main()"]


def relctl_process(project: Path, *args: str, pause_at: str | None = None,
                   marker: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    env.pop("MLFLOW_TRACKING_URI")
    if pause_at is not None and marker is not None:
        env |= {"RELCTL_PAUSE_AT": pause_at, "RELCTL_PAUSE_FILE": str(marker)}
    return subprocess.Popen([*RELCTL, "--project-dir", str(project), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def kill_when_paused(proc: subprocess.Popen[str], marker: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not marker.is_file():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the process never reached its pause point"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def two_versions(project: Path, tmp: Path) -> tuple[str, str, Registry]:
    v1, v2 = _register(project, tmp, 1), _register(project, tmp, 2)
    return v1, v2, Registry(resolve_store(project))


def test_a_rollback_killed_after_recording_its_intent_is_abandoned_by_the_next_command(
        project_dir: Path, tmp_path: Path) -> None:
    v1, v2, registry = two_versions(project_dir, tmp_path)
    marker = tmp_path / "paused"
    kill_when_paused(relctl_process(project_dir, "rollback", MODEL, pause_at="alias-move:intent-recorded",
                                    marker=marker), marker)
    pending = [m for m in read_history(registry.client, MODEL, include_abandoned=True) if m.state == "pending"]
    assert len(pending) == 1 and pending[0].action == "rollback"
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}
    # The next command repairs first: the move never happened, so history does not claim it did.
    moves = api.history(MODEL, project_dir)
    assert [m.action for m in moves] == ["promote", "promote"]
    # The dead process's lock did not block anyone, and the rollback can now really happen.
    move = api.rollback(MODEL, project_dir, "again")
    assert move.changes["production"] == [v2, v1]
    assert registry.aliases(MODEL) == {"production": v1}
    assert [m.action for m in registry.history(MODEL)] == ["promote", "promote", "rollback"]


def test_a_rollback_killed_after_moving_the_aliases_is_confirmed_by_the_next_command(
        project_dir: Path, tmp_path: Path) -> None:
    v1, _v2, registry = two_versions(project_dir, tmp_path)
    marker = tmp_path / "paused"
    kill_when_paused(relctl_process(project_dir, "rollback", MODEL, pause_at="alias-move:aliases-moved",
                                    marker=marker), marker)
    assert registry.aliases(MODEL) == {"production": v1}
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "history", MODEL, "--json"])
    assert result.exit_code == 0, result.output
    moves = json.loads(result.stdout)
    assert [(m["action"], m["state"]) for m in moves] == [("promote", "done"), ("promote", "done"),
                                                          ("rollback", "done")]
    # Rollback now knows v1 replaced nothing: there is nothing further back to go to.
    again = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", MODEL])
    assert again.exit_code == 2 and "no 'previous' alias" in again.stderr


def test_two_rollbacks_at_once_move_production_once(project_dir: Path, tmp_path: Path) -> None:
    v1, v2, registry = two_versions(project_dir, tmp_path)
    procs = [relctl_process(project_dir, "rollback", MODEL, "--reason", f"rollback {i}") for i in range(2)]
    outcomes = [(p.wait(120), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    assert registry.aliases(MODEL) == {"production": v1}
    history = registry.history(MODEL)
    assert [m.action for m in history] == ["promote", "promote", "rollback"]
    assert history[-1].changes["production"] == [v2, v1]


def test_a_move_that_changes_nothing_is_not_recorded(project_dir: Path, tmp_path: Path) -> None:
    _v1, v2, registry = two_versions(project_dir, tmp_path)
    before = len(registry.history(MODEL))
    assert registry.move_aliases(MODEL, {"production": v2}, "promote", "same again", None) is None
    assert len(registry.history(MODEL)) == before


def test_rollback_refuses_a_package_whose_manifest_was_rewritten_to_match(project_dir: Path, tmp_path: Path) -> None:
    v1, v2, registry = two_versions(project_dir, tmp_path)
    run_id = registry.get_version(MODEL, v1).run_id
    root = Path(registry.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "package"
    (root / "model" / "model.onnx").write_bytes(b"rewritten")
    manifest = json.loads((root / "relctl-package.json").read_text())
    from release.core.hashing import sha256_file

    manifest["files"]["model/model.onnx"] = sha256_file(root / "model" / "model.onnx")
    (root / "relctl-package.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", MODEL])
    assert result.exit_code == 2, result.output
    assert "differs from the manifest recorded in the registry" in result.stderr
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}
    assert registry.get_version(MODEL, v1).tags[T.MANIFEST_SHA256] != sha256_file(root / "relctl-package.json")
