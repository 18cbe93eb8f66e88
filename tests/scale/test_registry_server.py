"""The registry tests of tests/registry/, run against `mlflow server` on PostgreSQL + SeaweedFS S3.

The test functions of test_aliases.py and test_crash_and_race.py run unchanged (their model name made
unique: the server is shared by the session; their relctl processes keep MLFLOW_TRACKING_URI); only tampering
with a stored package differs, since the bytes live in S3, not in a folder.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.registry import Registry
from release.registry.store import resolve_store
from tests.registry import test_aliases as embedded
from tests.registry import test_crash_and_race as crash
from tests.scale.conftest import BUCKET, ScaleRegistry


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"demo-model-{secrets.token_hex(3)}"
    monkeypatch.setattr(embedded, "MODEL", name)
    monkeypatch.setattr(crash, "MODEL", name)
    return name


def relctl_process_on_server(project: Path, *args: str, pause_at: str | None = None,
                             marker: Path | None = None) -> subprocess.Popen[str]:
    """crash.relctl_process, keeping this test's MLFLOW_TRACKING_URI (it drops it to use the embedded store)."""
    env = dict(os.environ)
    if pause_at is not None and marker is not None:
        env |= {"RELCTL_PAUSE_AT": pause_at, "RELCTL_PAUSE_FILE": str(marker)}
    return subprocess.Popen([*crash.RELCTL, "--project-dir", str(project), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("case", [
    embedded.test_promote_rollback_history,
    embedded.test_rollback_without_previous_is_bad_input,
    embedded.test_status_and_unknown_model,
    # Killed mid-move (the process, the registry's connection with it) and repaired by the next command;
    # two rollbacks at once through the server's lease.
    crash.test_a_rollback_killed_after_recording_its_intent_is_abandoned_by_the_next_command,
    crash.test_a_rollback_killed_after_moving_the_aliases_is_confirmed_by_the_next_command,
    crash.test_two_rollbacks_at_once_move_production_once,
    crash.test_a_move_that_changes_nothing_is_not_recorded,
], ids=lambda f: f.__name__)
def test_registry_case_on_server(case: object, server_env: ScaleRegistry, model: str, project_dir: Path,
                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crash, "relctl_process", relctl_process_on_server)
    case(project_dir, tmp_path)  # type: ignore[operator]
    # It really ran against the server: the versions are there, and the project has no embedded store.
    store = resolve_store(project_dir)
    assert store.tracking_uri == server_env.tracking_uri and not store.embedded
    assert "production" in Registry(store).aliases(model)
    assert not (project_dir / ".relctl" / "mlflow.db").exists()


def test_rollback_refuses_a_package_tampered_in_s3(server_env: ScaleRegistry, model: str, project_dir: Path,
                                                   tmp_path: Path) -> None:
    v1 = embedded._register(project_dir, tmp_path, 1)
    v2 = embedded._register(project_dir, tmp_path, 2)
    registry = Registry(resolve_store(project_dir))
    run = registry.client.get_run(registry.get_version(model, v1).run_id)
    key = server_env.artifact_key(run.info.artifact_uri) + "/package/model/model.onnx"
    s3 = server_env.s3()
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == bytes([1]) * 128  # the package is in S3
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"tampered")
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", model])
    assert result.exit_code == 2, result.output
    assert "model/model.onnx does not match its sha256" in result.stderr
    assert registry.aliases(model) == {"production": v2, "previous": v1}
