"""The alias lease's namespace and deadline (issue 22, class 1), on a real MLflow SQLite store.

`relctl.lock.MODEL` is relctl's lease for MODEL: no user model may take such a name through relctl, a
model that is there without relctl's lease marker is never hidden or deleted, and every wait for the
lease ends (exit 4, naming the holder) by RELCTL_LOCK_WAIT_S, whatever is in the way.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from release.backends import backend_for_folder
from release.cli import cli
from release.core.package import build_package
from release.registry import Registry
from release.registry.lock import LEASE_TAG
from release.registry.store import resolve_store
from tests.registry.test_aliases import MODEL
from tests.registry.test_crash_and_race import two_versions

LEASE = f"relctl.lock.{MODEL}"


def relctl_run(project: Path, *args: str, wait_s: float = 2.0, timeout: float = 60) -> tuple[int, str, float]:
    """A real relctl process (a lock that never ends fails the test by the timeout instead of hanging it)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"RELCTL_LOCK_WAIT_S": str(wait_s)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from release.cli import main; main()", "--project-dir",
                           str(project), *args], env=env, text=True, capture_output=True, timeout=timeout)
    return done.returncode, done.stderr, time.monotonic() - started


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def lease_tags(kind: str, pid: int, nonce: str) -> dict[str, str]:
    return {LEASE_TAG: kind, "nonce": nonce, "host": socket.gethostname(), "pid": str(pid), "purpose": "rollback",
            "expires": f"{time.time() + 600:.3f}", "since": "2025-01-01T00:00:00+00:00"}


def test_a_model_named_like_a_lease_is_refused_by_register_and_promote(project_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "rt").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "rt" / "genai_config.json").write_text('{"model": {"type": "llama"}}')
    (tmp_path / "rt" / "model.onnx").write_bytes(b"\0" * 64)
    (tmp_path / "src" / "config.json").write_text('{"model_type": "llama"}')
    package = build_package(tmp_path / "pkg", tmp_path / "rt", tmp_path / "src", {"precision": "fp32"},
                            backend_for_folder(tmp_path / "rt"))
    for args in (["register", str(package.root), "--model", LEASE, "--production"],
                 ["promote", "0123456789abcdef", "--model", "RELCTL.LOCK.other"]):
        result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), *args])
        assert result.exit_code == 2, result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "is reserved" in errors[0], result.stderr
    registry = Registry(resolve_store(project_dir))
    assert [m.name for m in registry.client.search_registered_models()] == []   # nothing half-written


def test_a_user_model_under_the_lease_name_is_listed_and_never_deleted(project_dir: Path, tmp_path: Path) -> None:
    v1, v2, registry = two_versions(project_dir, tmp_path)
    registry.client.create_registered_model(LEASE, description="someone's own model")   # straight into MLflow
    status = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "status", "--json"])
    assert LEASE in status.stdout                                       # not hidden as if it were a lease
    code, err, seconds = relctl_run(project_dir, "rollback", MODEL)
    assert code == 4, err
    assert f"'{LEASE}'" in err and "not a relctl lease" in err and seconds < 30
    assert registry.model_exists(LEASE)                                 # not taken for a stale lease
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}


def test_a_stale_lease_and_a_leftover_break_marker_end_in_exit_4_by_the_deadline(project_dir: Path,
                                                                                  tmp_path: Path) -> None:
    v1, v2, registry = two_versions(project_dir, tmp_path)
    holder = dead_pid()
    registry.client.create_registered_model(LEASE, tags=lease_tags("lease", holder, "aaaa"))
    # A breaker of an older relctl died after creating its marker: nothing proves it is relctl's.
    registry.client.create_registered_model(f"{LEASE}.break.aaaa")
    code, err, seconds = relctl_run(project_dir, "rollback", MODEL, wait_s=2)
    assert code == 4, err
    error = next(line for line in err.splitlines() if line.startswith("error:"))
    assert f"pid {holder} on {socket.gethostname()}" in error and "gave up after 2 s" in error
    assert f"{LEASE}.break.aaaa" in error and seconds < 30
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}


def test_a_dead_breakers_marker_is_cleared_and_the_stale_lease_broken(project_dir: Path, tmp_path: Path) -> None:
    v1, _v2, registry = two_versions(project_dir, tmp_path)
    registry.client.create_registered_model(LEASE, tags=lease_tags("lease", dead_pid(), "bbbb"))
    registry.client.create_registered_model(f"{LEASE}.break.bbbb", tags=lease_tags("break", dead_pid(), "cccc"))
    code, err, _ = relctl_run(project_dir, "rollback", MODEL, wait_s=20)
    assert code == 0, err
    assert registry.aliases(MODEL) == {"production": v1}
    assert not registry.model_exists(LEASE) and not registry.model_exists(f"{LEASE}.break.bbbb")
