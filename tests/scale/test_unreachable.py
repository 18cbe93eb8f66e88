"""A tracking server that cannot be reached: one line naming it and the fix, exit 4, within the timeout.

Two ways a server is unreachable on 127.0.0.1: a closed port (refused at once) and a socket that
accepts connections but never answers (the wait is the configured timeout). MLflow's defaults would
wait 120 s per request and retry 7 times. Nothing may be written: no .relctl/ state, no log, no run.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.core.errors import ConfigError, RegistryError
from release.registry.store import resolve_store

TIMEOUT_S = 2
PASSWORD = "hunter2-never-printed"


@pytest.fixture()
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: nothing listens there


@pytest.fixture()
def silent_port() -> Iterator[int]:
    """A port that completes the TCP handshake (the kernel's backlog) and never sends a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


@pytest.fixture()
def unreachable_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                "MLFLOW_REGISTRY_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RELCTL_REGISTRY_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ci")
    return monkeypatch


@pytest.fixture(scope="module")
def warm_cli(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One untimed run first: the timed ones then measure the wait, not importing MLflow and torch."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        project = tmp_path_factory.mktemp("warm")
        for command in (["status"], ["promote", "0123456789abcdef"]):
            CliRunner().invoke(cli, ["--project-dir", str(project), *command])


@pytest.mark.usefixtures("warm_cli")
@pytest.mark.parametrize("command", [["status"], ["status", "tiny-llm"], ["promote", "0123456789abcdef"],
                                     ["history", "tiny-llm"]], ids=" ".join)
@pytest.mark.parametrize("how", ["closed", "silent"])
def test_unreachable_server_fails_fast_with_one_line_and_writes_nothing(
        how: str, command: list[str], request: pytest.FixtureRequest, unreachable_env: pytest.MonkeyPatch,
        project_dir: Path) -> None:
    port = request.getfixturevalue(f"{how}_port")
    uri = f"http://127.0.0.1:{port}"
    # Credentials in the URI itself too: they must not reach the message.
    unreachable_env.setenv("MLFLOW_TRACKING_URI", f"http://ci:{PASSWORD}@127.0.0.1:{port}")
    (project_dir / "release.yaml").write_text("model: tiny-llm\nconvert:\n  precision: fp32\n")
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), *command])
    elapsed = time.monotonic() - started
    assert result.exit_code == 4, result.output
    lines = result.stderr.splitlines()
    what = "refused the connection (nothing listens there)" if how == "closed" else \
        f"did not answer within {TIMEOUT_S} s"
    assert lines[0] == f"error: tracking server {uri} {what}", lines
    assert len(lines) == 2 and lines[1].startswith("hint: check MLFLOW_TRACKING_URI, that the server is running")
    assert "RELCTL_REGISTRY_TIMEOUT_S" in lines[1]
    assert PASSWORD not in result.output + result.stderr
    assert result.stdout == ""
    # Generous bound for a hang check: the probe waits TIMEOUT_S once and never retries.
    assert elapsed < TIMEOUT_S + 3, f"took {elapsed:.1f} s"
    assert sorted(p.name for p in project_dir.iterdir()) == ["release.yaml"], "something was written"


def test_timeout_and_retries_are_read_and_checked(project_dir: Path) -> None:
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "RELCTL_REGISTRY_TIMEOUT_S": "7",
           "RELCTL_REGISTRY_RETRIES": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "4"}
    store = resolve_store(project_dir, env)
    assert (store.timeout_s, store.retries, store.backoff_s) == (7, 0, 4)
    assert store.is_server and store.artifact_root is None  # the server picks its artifact store
    defaults = resolve_store(project_dir, {"MLFLOW_TRACKING_URI": "https://mlflow.example/x"})
    assert (defaults.timeout_s, defaults.retries, defaults.backoff_s) == (30, 3, 1)
    with pytest.raises(ConfigError, match=r"RELCTL_REGISTRY_TIMEOUT_S='soon' is not a whole number"):
        resolve_store(project_dir, {**env, "RELCTL_REGISTRY_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match=r"RELCTL_REGISTRY_RETRIES='11'"):
        resolve_store(project_dir, {**env, "RELCTL_REGISTRY_RETRIES": "11"})


def test_connect_sets_mlflow_http_settings_explicitly(monkeypatch: pytest.MonkeyPatch, silent_port: int,
                                                      project_dir: Path) -> None:
    from release.registry.store import connect

    for key in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(key, raising=False)
    store = resolve_store(project_dir, {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{silent_port}",
                                        "RELCTL_REGISTRY_TIMEOUT_S": "1", "RELCTL_REGISTRY_RETRIES": "2"})
    with pytest.raises(RegistryError, match="did not answer within 1 s"):
        connect(store)
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"
