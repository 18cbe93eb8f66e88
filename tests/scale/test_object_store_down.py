"""The tracking server answers but its object store does not: one line, exit 4, nothing moved or half-written.

A second `mlflow server` on the session's PostgreSQL database serves artifacts from an S3 endpoint
where nothing listens. MLflow's client retries the server's 500s (RELCTL_REGISTRY_RETRIES with
backoff), then relctl reports the failure; aliases stay where they were.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from release.cli import cli
from release.registry import Registry
from release.registry.store import resolve_store
from tests.registry import test_aliases as embedded
from tests.scale.conftest import PG_DATABASE, ScaleRegistry, _stop, _wait, free_port


@pytest.fixture()
def storeless_server(scale_registry: ScaleRegistry, tmp_path: Path) -> Iterator[str]:
    port, dead_s3 = free_port(), free_port()
    log = tmp_path / "mlflow-storeless.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{dead_s3}",
           "AWS_ACCESS_KEY_ID": scale_registry.aws_access_key_id,
           "AWS_SECRET_ACCESS_KEY": scale_registry.aws_secret_access_key, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_MAX_ATTEMPTS": "1"}
    backend = scale_registry.postgres_uri.rsplit("/", 1)[0] + f"/{PG_DATABASE}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
             "--artifacts-destination", "s3://relctl-scale/mlflow-artifacts", "--serve-artifacts",
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait("mlflow server without its object store",
              lambda: httpx.get(f"{uri}/health", timeout=2).status_code == 200, proc, log)
        yield uri
    finally:
        _stop([proc])


def test_rollback_fails_in_one_line_when_the_object_store_is_down(
        server_env: ScaleRegistry, storeless_server: str, project_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"storeless-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    monkeypatch.setattr(embedded, "MODEL", name)
    v1 = embedded._register(project_dir, tmp_path, 1)          # through the healthy server
    v2 = embedded._register(project_dir, tmp_path, 2)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", storeless_server)  # same database, dead object store
    monkeypatch.setenv("RELCTL_REGISTRY_RETRIES", "1")
    monkeypatch.setenv("RELCTL_REGISTRY_TIMEOUT_S", "5")
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", name])
    elapsed = time.monotonic() - started
    lines = result.stderr.splitlines()
    assert result.exit_code == 4, result.output
    assert lines[0].startswith("error: ") and len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert elapsed < 60, f"took {elapsed:.0f} s"
    registry = Registry(resolve_store(project_dir))
    assert registry.aliases(name) == {"production": v2, "previous": v1}
    assert [m.action for m in registry.history(name)] == ["promote", "promote"]
    assert server_env.aws_secret_access_key not in result.output + result.stderr
