"""MLFLOW_TRACKING_URI naming a database directly (postgresql://): explicit artifact locations, never ./mlruns.

MLflow opened on a database URI with no artifact root puts artifacts in ./mlruns of whatever the
current directory is. relctl gives every experiment it creates, and the database's Default
experiment, the project's .relctl/artifacts/ (or RELCTL_ARTIFACT_ROOT).
"""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from release.cli import cli
from release.core.errors import RegistryError
from release.registry.store import connect, ensure_experiment, redact_uri, resolve_store
from tests.registry import test_aliases as embedded
from tests.scale.conftest import ScaleRegistry


@pytest.fixture()
def direct_db(scale_registry: ScaleRegistry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ScaleRegistry:
    """relctl on the PostgreSQL database itself, from a current directory that must stay empty."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", scale_registry.postgres_uri)
    monkeypatch.delenv("RELCTL_ARTIFACT_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(embedded, "MODEL", f"direct-{secrets.token_hex(3)}")
    return scale_registry


def test_postgresql_uri_gets_the_project_artifact_root(direct_db: ScaleRegistry, project_dir: Path,
                                                       tmp_path: Path) -> None:
    root = (project_dir / ".relctl" / "artifacts").resolve().as_uri()
    store = resolve_store(project_dir)
    assert (store.tracking_uri, store.artifact_root, store.embedded) == (direct_db.postgres_uri, root, False)
    version = embedded._register(project_dir, tmp_path, 1)
    client = MlflowClient(tracking_uri=direct_db.postgres_uri)
    mv = client.get_model_version(embedded.MODEL, version)
    run = client.get_run(mv.run_id)
    assert run.info.artifact_uri.startswith(f"{root}/releases/")
    packaged = Path(run.info.artifact_uri.removeprefix("file://")) / "package" / "relctl-package.json"
    assert packaged.is_file()
    # The Default experiment too: created by relctl's first connection, with relctl's root.
    default = client.get_experiment("0").artifact_location
    assert default.startswith("file:///") and "mlruns" not in default, default
    assert list(Path.cwd().iterdir()) == [], "MLflow wrote into the current directory"
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "status", embedded.MODEL, "--json"])
    assert result.exit_code == 0, result.output
    assert direct_db.pg_password not in result.output + result.stderr


def test_relctl_artifact_root_wins_and_is_made_absolute(direct_db: ScaleRegistry, project_dir: Path,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_ARTIFACT_ROOT", "elsewhere")  # relative: resolved now, not at use
    store = resolve_store(project_dir)
    assert store.artifact_root == (Path.cwd() / "elsewhere").as_uri()
    connect(store)
    name = f"direct-exp-{secrets.token_hex(3)}"
    experiment = MlflowClient(tracking_uri=store.tracking_uri).get_experiment(ensure_experiment(store, name))
    assert experiment.artifact_location == f"{store.artifact_root}/{name}"


def test_database_unreachable_or_refusing_the_login_fails_fast_without_the_password(
        scale_registry: ScaleRegistry, project_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_REGISTRY_TIMEOUT_S", "2")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = int(sock.getsockname()[1])
    secret = scale_registry.pg_password
    wrong_login = scale_registry.postgres_uri.replace(secret, f"{secret}-wrong")
    closed_port = f"postgresql://relctl:{secret}@127.0.0.1:{closed}/direct"
    for uri, expected in ((closed_port, "refused the connection"), (wrong_login, "password authentication failed")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        started = time.monotonic()
        with pytest.raises(RegistryError) as failure:
            connect(resolve_store(project_dir))
        assert time.monotonic() - started < 2 + 3
        assert expected in failure.value.message and failure.value.message.startswith(f"database {redact_uri(uri)}")
        assert secret not in failure.value.message + str(failure.value.hint)
    assert not (project_dir / ".relctl").exists()


def test_redact_uri_drops_userinfo_and_secret_query_values() -> None:
    assert redact_uri("postgresql://u:p4ss@db:5432/mlflow?sslmode=require&password=x") == \
        "postgresql://db:5432/mlflow?sslmode=require&password=%2A%2A%2A"
    assert redact_uri("https://tok@mlflow.example/prefix") == "https://mlflow.example/prefix"


def test_messages_name_the_database_without_its_password(direct_db: ScaleRegistry, project_dir: Path) -> None:
    for command in (["status", "no-such-model"], ["promote", "0123456789abcdef0123456789abcdef"]):
        result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), *command])
        assert result.exit_code == 2, result.output
        assert f"not found in {redact_uri(direct_db.postgres_uri)}" in result.stderr
        assert direct_db.pg_password not in result.output + result.stderr
