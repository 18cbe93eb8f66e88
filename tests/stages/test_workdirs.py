"""Work folders after a release: the checkpoint copies go at once, `relctl gc` removes the rest of a
finished release's folder (listing first, deleting only with --yes), keeps an unfinished one unless --all,
and never touches the folder of a promote in flight (it holds the run's promote lock)."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.pipeline.runner import _promote_lock_path
from release.registry.store import resolve_store
from tests.conftest import load_train_module

pytestmark = pytest.mark.slow
MODEL = "tiny-llm"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def test_a_release_prunes_its_checkpoint_copies_and_gc_removes_the_rest(tmp_path: Path, tiny_run: Any) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: int8\n")
    run = load_train_module().log_run(tiny_run, project, experiment=MODEL)
    work_root = project / ".relctl" / "work"
    result = relctl(project, "promote", run, "--json")
    assert result.exit_code == 0, result.output + result.stderr
    assert "removed the fetched and merged checkpoints" in result.stderr
    stages = {p.name.rsplit("-", 1)[0] for p in (work_root / run).iterdir() if p.is_dir()}
    assert not stages & {"intake", "merge"}                         # the two checkpoint copies are gone
    assert {"reference", "convert", "validate", "package"} <= stages  # what a re-run resumes stays

    unfinished = work_root / "0123abcd"  # a release that never registered anything: its resume is kept
    (unfinished / "intake-000000000000").mkdir(parents=True)
    (unfinished / "intake-000000000000" / "model.safetensors").write_bytes(b"\0" * 4096)

    listed = relctl(project, "gc", "--json")
    assert listed.exit_code == 0, listed.output + listed.stderr
    rows = {r["run"]: r for r in json.loads(listed.stdout)}
    assert rows[run]["finished"] and rows[run]["would_remove"] and not rows[run]["removed"]
    assert not rows["0123abcd"]["would_remove"]
    assert (work_root / run).is_dir()  # listing deletes nothing

    # A promote of the run in flight holds its lock: gc --yes leaves its folder alone.
    lock = _promote_lock_path(f"{resolve_store(project).tracking_uri}|{run}", work_root / run)
    with lock.open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = relctl(project, "gc", "--yes", "--json")
        fcntl.flock(held, fcntl.LOCK_UN)
    assert busy.exit_code == 0, busy.output + busy.stderr
    assert {r["run"]: r for r in json.loads(busy.stdout)}[run]["in_flight"]
    assert (work_root / run).is_dir()

    done = relctl(project, "gc", "--yes")
    assert done.exit_code == 0, done.output + done.stderr
    assert not (work_root / run).exists() and unfinished.is_dir()
    assert "freed" in done.stdout
    assert relctl(project, "gc", "--yes", "--all").exit_code == 0
    assert not unfinished.exists()
