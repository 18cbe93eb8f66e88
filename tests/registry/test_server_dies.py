"""The tracking server dies in the middle of a promote: exit 4 (the registry failed), never 3 (a bug).

Recording the release report after a failure talks to the same dead server; that second failure used to
be raised from a `finally` and replaced the first (an MlflowException: "unexpected", exit 3). A real
`mlflow server` on 127.0.0.1 is killed while the promote waits at `register:before`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.slow
RELCTL = Path(sys.executable).parent / "relctl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_server_that_dies_before_register_is_exit_4(tmp_path: Path, tiny_checkpoint: Path) -> None:
    port, log = free_port(), tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'm.db'}",
             "--default-artifact-root", (tmp_path / "art").as_uri(), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"], env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        client = MlflowClient(tracking_uri=uri)
        run_id = client.create_run(client.create_experiment("dies")).info.run_id
        client.log_artifacts(run_id, str(tiny_checkpoint), "checkpoint")
        client.log_text(run_id, '{"prompt": "reverse a b c d ->"}\n', "validation/prompts.jsonl")
        client.set_terminated(run_id)

        project, marker = tmp_path / "project", tmp_path / "paused"
        project.mkdir()
        promote = subprocess.Popen(
            [str(RELCTL), "--project-dir", str(project), "promote", run_id, "--precision", "fp32", "--json"],
            env={**env, "MLFLOW_TRACKING_URI": uri, "RELCTL_REGISTRY_RETRIES": "0", "RELCTL_REGISTRY_TIMEOUT_S": "3",
                 "RELCTL_PAUSE_AT": "register:before", "RELCTL_PAUSE_FILE": str(marker)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while not marker.is_file():
            assert promote.poll() is None, promote.communicate()
            assert time.monotonic() < deadline, "the promote never reached register"
            time.sleep(0.1)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    marker.unlink()  # the promote goes on, to a dead server
    out, err = promote.communicate(timeout=180)
    lines = [line for line in err.splitlines() if line.startswith(("error: ", "hint: "))]
    assert promote.returncode == 4, err
    assert len(lines) == 2 and "unexpected" not in lines[0] and "this is a relctl bug" not in lines[1], err
    assert "the release report could not be recorded" in err  # said, not raised over the real error
