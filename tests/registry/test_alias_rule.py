"""One rule for which versions an alias may point at (issue 22, class 3), on a real MLflow SQLite store.

Every alias move goes through Registry.locked_move, which asks registry/states.py: rollback, register,
the canary's start and finish all refuse a version that never passed its gates, and the unwind of a
canary cut short leaves no version `registering` behind a `candidate` alias, even while SQLite is busy.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.core.errors import InputError
from release.registry import CANDIDATE
from release.registry import tags as T
from release.registry.transitions import unwind
from tests.registry.test_aliases import MODEL, _register
from tests.registry.test_crash_and_race import two_versions


def rollback(project: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--project-dir", str(project), "rollback", MODEL, *args])
    return result.exit_code, result.stderr


@pytest.mark.parametrize("state", ["rejected", "stopped", "registering"])
def test_rollback_to_a_version_that_never_passed_is_refused_naming_its_state(project_dir: Path, tmp_path: Path,
                                                                              state: str) -> None:
    v1, v2, registry = two_versions(project_dir, tmp_path)
    v3 = _register(project_dir, tmp_path, 3)
    registry.set_version_tag(MODEL, v1, T.RELEASE_STATE, state)
    code, err = rollback(project_dir, "--to", v1)
    assert code == 2, err
    lines = err.splitlines()
    assert lines[0].startswith(f"error: {MODEL}: production may not point at v{v1}: it is {state} (")
    assert lines[1].startswith("hint:") and "--allow-unreleased" in lines[1]
    assert registry.aliases(MODEL) == {"production": v3, "previous": v2}
    # The override is explicit, and the history says it was used.
    code, err = rollback(project_dir, "--to", v1, "--allow-unreleased")
    assert code == 0, err
    assert registry.aliases(MODEL)["production"] == v1
    last = registry.history(MODEL)[-1]
    assert last.action == "rollback" and f"forced with --allow-unreleased: production may not point at v{v1}" \
        in last.reason


def test_every_alias_move_obeys_the_same_rule(project_dir: Path, tmp_path: Path) -> None:
    _v1, v2, registry = two_versions(project_dir, tmp_path)
    v3 = _register(project_dir, tmp_path, 3)
    registry.move_aliases(MODEL, {"production": v2, "previous": _v1}, "rollback", "v3 off production", None)
    registry.set_version_tags(MODEL, v3, {T.RELEASE_STATE: "registering", T.RELEASE_RUN: "run-a"})
    # A registering version: only the release run creating it may alias it (register, the canary's pass).
    with pytest.raises(InputError, match=f"candidate may not point at v{v3}: it is registering"):
        registry.move_aliases(MODEL, {CANDIDATE: v3}, "canary-start", "another release's version", "run-b")
    registry.move_aliases(MODEL, {CANDIDATE: v3}, "candidate", "its own release", "run-a")
    registry.set_version_tag(MODEL, v3, T.RELEASE_STATE, "rejected")
    with pytest.raises(InputError, match=f"production may not point at v{v3}: it is rejected"):
        registry.move_aliases(MODEL, {"production": v3}, "canary", "pass?", "run-a")
    assert registry.aliases(MODEL) == {"production": v2, "previous": _v1, CANDIDATE: v3}


def test_a_canary_unwind_leaves_nothing_registering_even_while_sqlite_is_busy(project_dir: Path,
                                                                              tmp_path: Path) -> None:
    _v1, v2, registry = two_versions(project_dir, tmp_path)
    v3 = _register(project_dir, tmp_path, 3)
    registry.move_aliases(MODEL, {"production": v2}, "rollback", "v3 back to candidate", None)
    registry.set_version_tags(MODEL, v3, {T.RELEASE_STATE: "registering", T.RELEASE_RUN: "run-a"})
    registry.move_aliases(MODEL, {CANDIDATE: v3}, "candidate", "under canary", "run-a")
    # Another writer holds the store longer than SQLite's busy timeout (5 s): the unwind must outlast it.
    db = project_dir / ".relctl" / "mlflow.db"
    held = threading.Event()

    def hold() -> None:
        con = sqlite3.connect(db, timeout=30, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(7)
        con.execute("COMMIT")
        con.close()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    move = unwind(registry, MODEL, v3, "canary interrupted: terminated (SIGTERM)", "run-a")
    holder.join()
    assert move is not None and move.changes == {CANDIDATE: [v3, None]} and move.action == "canary-stopped"
    tags = registry.get_version(MODEL, v3).tags
    assert tags[T.RELEASE_STATE] == "stopped" and tags["gate.canary.status"] == "stopped"
    assert CANDIDATE not in registry.aliases(MODEL)
    # ... and a stopped version may not serve, but may go under a canary again.
    with pytest.raises(InputError, match="it is stopped"):
        registry.move_aliases(MODEL, {"production": v3}, "rollback", "no", None)
    registry.move_aliases(MODEL, {CANDIDATE: v3}, "canary-start", "again", None)
