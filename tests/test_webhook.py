"""`relctl webhook` against MLflow's own webhook delivery: a real `mlflow server` (SQLite) on 127.0.0.1
delivers model-registry events to the receiver, which starts one promote per version tagged for release.

The refusals (bad signature, old timestamp, replayed delivery id) are signed exactly as MLflow's delivery
code signs them (`mlflow.webhooks.delivery._generate_hmac_signature`, MLflow's own function) and sent
with the same headers; each is 401 and starts nothing. The "promote" is a small script that writes a
marker file per start, so the test counts starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import uvicorn
from cryptography.fernet import Fernet
from mlflow import MlflowClient
from mlflow.webhooks.delivery import _generate_hmac_signature
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from release.webhook.receiver import sign

SECRET = "shared-secret-for-tests"
RELCTL = Path(sys.executable).parent / "relctl"
MARKER_SCRIPT = """import json, pathlib, sys, time, uuid
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"{time.time_ns()}-{uuid.uuid4().hex}.json").write_text(json.dumps(sys.argv[2:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, ok: Callable[[], bool], proc: subprocess.Popen[bytes] | None, log: Path,
             timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ok():
                return
        except (httpx.HTTPError, OSError, ValueError):
            pass
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready within {timeout_s} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on SQLite, allowed to deliver webhooks over http to 127.0.0.1 (test-only settings)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {**os.environ, "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
           "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(), "MLFLOW_WEBHOOK_CACHE_TTL": "1",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    log = root / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                 f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", (root / "art").as_uri(),
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for("mlflow server", lambda: httpx.get(f"{uri}/health", timeout=2).status_code == 200, proc, log)
        yield uri
    finally:
        stop(proc)


@dataclass
class Receiver:
    url: str
    markers: Path
    log: Path

    def starts(self) -> list[list[str]]:
        if not self.markers.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.markers.iterdir())]


def start_receiver(root: Path, tracking_uri: str, *args: str, env: dict[str, str] | None = None,
                   ) -> tuple[subprocess.Popen[bytes], Receiver]:
    root.mkdir(parents=True, exist_ok=True)
    script = root / "marker.py"
    script.write_text(MARKER_SCRIPT)
    markers = root / "markers"
    ready = root / "ready.json"
    log = root / "webhook.log"
    command = f"{sys.executable} {script} {markers} {{run_id}} {{model}} {{version}}"
    full_env = {**os.environ, "RELCTL_WEBHOOK_SECRET": SECRET, "MLFLOW_TRACKING_URI": tracking_uri, **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(RELCTL), "--project-dir", str(root), "webhook", "--port", "0",
                                 "--ready-file", str(ready), *(args or ("--command", command))],
                                env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for("relctl webhook", lambda: ready.is_file() and httpx.get(
        json.loads(ready.read_text())["url"] + "health", timeout=2).status_code == 200, proc, log)
    return proc, Receiver(json.loads(ready.read_text())["url"], markers, log)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory, tracking_uri: str) -> Iterator[Receiver]:
    proc, rec = start_receiver(tmp_path_factory.mktemp("receiver"), tracking_uri)
    try:
        yield rec
    finally:
        stop(proc)


def mlflow_delivery(entity: str, action: str, data: dict[str, Any], timestamp: int | None = None,
                    delivery_id: str | None = None, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    """Body and headers exactly as mlflow/webhooks/delivery.py's _send_webhook_request builds them."""
    payload = json.dumps({"entity": entity, "action": action, "timestamp": "2026-01-01T00:00:00+00:00",
                          "data": data})
    delivery_id = delivery_id or str(uuid.uuid4())
    ts = str(int(time.time()) if timestamp is None else timestamp)
    headers = {"Content-Type": "application/json", "X-MLflow-Delivery-Id": delivery_id, "X-MLflow-Timestamp": ts,
               "X-MLflow-Signature": _generate_hmac_signature(secret, delivery_id, ts, payload)}
    return payload.encode("utf-8"), headers


def created(model: str, version: str, run_id: str, tagged: bool = True) -> dict[str, Any]:
    return {"name": model, "version": version, "source": f"runs:/{run_id}/model", "run_id": run_id,
            "tags": {"relctl.release": "true"} if tagged else {}, "description": None}


def wait_starts(rec: Receiver, count: int, timeout_s: float = 30) -> list[list[str]]:
    deadline = time.monotonic() + timeout_s
    while len(rec.starts()) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # a second, duplicate start would have shown up by now
    return rec.starts()


def test_signature_is_mlflows() -> None:
    body = b'{"entity": "model_version"}'
    assert sign(SECRET, "d-1", "1700000000", body) == _generate_hmac_signature(SECRET, "d-1", "1700000000",
                                                                                body.decode())


def test_mlflow_delivers_and_one_promote_starts_per_tagged_version(tracking_uri: str, receiver: Receiver) -> None:
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    client.create_webhook("relctl", receiver.url, events=["model_version.created", "model_version_tag.set"],
                          secret=SECRET)
    test = client.test_webhook(client.list_webhooks()[0].webhook_id)
    assert test.success and test.response_status == 200, test  # MLflow's example event: not a release
    run_a = client.create_run(client.create_experiment("train")).info.run_id
    run_b = client.create_run(client.get_experiment_by_name("train").experiment_id).info.run_id
    client.create_registered_model("shop-llm")
    before = len(receiver.starts())  # other tests share this receiver
    client.create_model_version("shop-llm", f"runs:/{run_a}/model", run_id=run_a, tags={"relctl.release": "true"})
    assert wait_starts(receiver, before + 1)[before:] == [[run_a, "shop-llm", "1"]]
    # Untagged: nothing starts; tagged afterwards (model_version_tag.set): the version's run is looked up.
    client.create_model_version("shop-llm", f"runs:/{run_b}/model", run_id=run_b)
    client.set_model_version_tag("shop-llm", "2", "note", "not the release tag")
    assert len(wait_starts(receiver, before + 2, timeout_s=3)) == before + 1
    client.set_model_version_tag("shop-llm", "2", "relctl.release", "true")
    assert wait_starts(receiver, before + 2)[before:] == [[run_a, "shop-llm", "1"], [run_b, "shop-llm", "2"]]
    # Tagging the same version again is a new delivery, but that version's promote already started.
    client.set_model_version_tag("shop-llm", "2", "relctl.release", "true")
    assert len(wait_starts(receiver, before + 3, timeout_s=3)) == before + 2


def post(rec: Receiver, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(rec.url, content=body, headers=headers, timeout=10)


def test_refusals_are_401_and_start_nothing(receiver: Receiver) -> None:
    before = len(receiver.starts())
    run_id = uuid.uuid4().hex
    body, headers = mlflow_delivery("model_version", "created", created("refused", "1", run_id), secret="wrong")
    bad_signature = post(receiver, body, headers)
    body, headers = mlflow_delivery("model_version", "created", created("refused", "1", run_id),
                                    timestamp=int(time.time()) - 301)
    stale = post(receiver, body, headers)
    body, headers = mlflow_delivery("model_version", "created", created("refused", "1", run_id))
    tampered = post(receiver, body.replace(b"refused", b"other"), headers)
    unsigned = post(receiver, body, {k: v for k, v in headers.items() if k != "X-MLflow-Signature"})
    for response, reason in ((bad_signature, "bad signature"), (stale, "stale timestamp"),
                             (tampered, "bad signature"), (unsigned, "missing")):
        assert response.status_code == 401 and reason in response.json()["reason"], response.text
    assert len(wait_starts(receiver, before + 1, timeout_s=2)) == before

    first = post(receiver, body, headers)
    assert first.status_code == 202, first.text
    replay = post(receiver, body, headers)
    assert replay.status_code == 401 and "replayed" in replay.json()["reason"]
    starts = wait_starts(receiver, before + 2, timeout_s=3)
    assert starts.count([run_id, "refused", "1"]) == 1 and len(starts) == before + 1


def test_default_command_is_relctl_promote_and_replays_are_refused_after_a_restart(tmp_path: Path,
                                                                                   tracking_uri: str) -> None:
    """No --command: a release runs `relctl promote RUN --model MODEL --json` (here on a run the tracking
    server does not have, so it ends with relctl's one-line error in the promote log)."""
    run_id = uuid.uuid4().hex
    body, headers = mlflow_delivery("model_version", "created", created("restart", "1", run_id))
    logs = tmp_path / "r" / ".relctl" / "webhook" / "logs"
    proc, rec = start_receiver(tmp_path / "r", tracking_uri, "--max-age", "300")
    try:
        accepted = post(rec, body, headers)
        assert accepted.status_code == 202
        assert f"promote --model restart --json -- {run_id}" in accepted.json()["started"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "error: " not in "".join(p.read_text() for p in logs.glob("*.log")):
            time.sleep(0.3)
        log = "".join(p.read_text() for p in logs.glob("*.log"))
        assert "error: " in log and run_id in log, log
    finally:
        stop(proc)
    proc, rec = start_receiver(tmp_path / "r", tracking_uri, "--max-age", "300")
    try:
        assert post(rec, body, headers).status_code == 401
        assert len(list(logs.glob("*.log"))) == 1
    finally:
        stop(proc)


@pytest.fixture()
def github_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in for GitHub's REST API on 127.0.0.1 that records repository_dispatch calls (204, like GitHub)."""
    calls: list[dict[str, Any]] = []

    async def dispatch(request: Request) -> Response:
        calls.append({"path": request.url.path, "auth": request.headers.get("authorization"),
                      "json": json.loads(await request.body())})
        # The first call fails, as GitHub does now and then: the receiver must let MLflow's retry through.
        return Response(status_code=502 if len(calls) == 1 else 204)

    app = Starlette(routes=[Route("/repos/{owner}/{repo}/dispatches", dispatch, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", calls
    server.should_exit = True
    thread.join(timeout=10)


def test_github_repository_dispatch(tmp_path: Path, tracking_uri: str,
                                    github_api: tuple[str, list[dict[str, Any]]]) -> None:
    api, calls = github_api
    proc, rec = start_receiver(tmp_path / "gh", tracking_uri, "--github-repo", "acme/models", "--github-api-url", api,
                               env={"GITHUB_TOKEN": "gh-token"})
    try:
        run_id = uuid.uuid4().hex
        body, headers = mlflow_delivery("model_version", "created", created("gh-llm", "4", run_id))
        assert post(rec, body, headers).status_code == 502  # GitHub failed: MLflow retries the same delivery
        assert post(rec, body, headers).status_code == 202
        assert post(rec, body, headers).status_code == 401  # and once it succeeded, it is a replay
    finally:
        stop(proc)
    expected = {"path": "/repos/acme/models/dispatches", "auth": "Bearer gh-token",
                "json": {"event_type": "relctl-promote",
                         "client_payload": {"run_id": run_id, "model": "gh-llm", "version": "4"}}}
    assert calls == [expected, expected]


def test_missing_secret_is_bad_input(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RELCTL_WEBHOOK_SECRET"}
    done = subprocess.run([str(RELCTL), "--project-dir", str(tmp_path), "webhook", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == "error: relctl webhook: environment variable RELCTL_WEBHOOK_SECRET is not set"


# --- limits: the headers and the size are checked before any body is read ------------------------------
LIMIT = 64 * 1024  # the receiver below reads at most this much


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, tracking_uri: str) -> Iterator[tuple[Receiver, int]]:
    proc, rec = start_receiver(tmp_path_factory.mktemp("limited"), tracking_uri, "--max-body-bytes", str(LIMIT),
                               "--command", f"{sys.executable} -c pass {{run_id}}")
    try:
        yield rec, proc.pid
    finally:
        stop(proc)


def rss(pid: int) -> int:
    value: int = psutil.Process(pid).memory_info().rss
    return value


def raw_post(url: str, headers: dict[str, str], body_chunks: Iterator[bytes]) -> tuple[str, int]:
    """POST over a raw socket, sending body chunks until the server answers; (status line, bytes sent).

    The socket's send buffer is small and the sends time out, so a server that stops reading shows up
    as an answer (or a closed connection) while most of the body is still unsent."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    head = "POST / HTTP/1.1\r\nHost: relctl\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sock.sendall(head.encode())
    sent = 0
    sock.settimeout(0.5)
    try:
        for chunk in body_chunks:
            try:
                sock.sendall(chunk)
                sent += len(chunk)
            except TimeoutError:
                break  # the server stopped reading: its answer is waiting
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.settimeout(10)
        answer = b""
        while b"\r\n" not in answer:
            part = sock.recv(4096)
            if not part:
                break
            answer += part
        return answer.split(b"\r\n", 1)[0].decode(), sent
    finally:
        sock.close()


def body_of(total: int, chunk: int = 64 * 1024, chunked: bool = False) -> Iterator[bytes]:
    for _ in range(total // chunk):
        data = b"x" * chunk
        yield f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data


def signed_headers(body: bytes = b"", delivery_id: str | None = None) -> dict[str, str]:
    delivery_id = delivery_id or str(uuid.uuid4())
    ts = str(int(time.time()))
    return {"X-MLflow-Delivery-Id": delivery_id, "X-MLflow-Timestamp": ts,
            "X-MLflow-Signature": sign(SECRET, delivery_id, ts, body), "Content-Type": "application/json"}


def test_an_unsigned_300_mb_post_is_refused_unread(limited: tuple[Receiver, int]) -> None:
    rec, pid = limited
    before = rss(pid)
    status, sent = raw_post(rec.url, {"Content-Length": str(300 * 1024 * 1024), "Content-Type": "application/json"},
                            body_of(300 * 1024 * 1024))
    assert status == "HTTP/1.1 401 Unauthorized", status
    assert sent < 32 * 1024 * 1024, sent  # answered long before the body was sent (socket buffers aside)
    assert rss(pid) - before < 20 * 1024 * 1024


def test_a_signed_post_over_the_limit_is_refused_by_its_length_or_while_chunked(limited: tuple[Receiver, int],
                                                                               ) -> None:
    rec, pid = limited
    before = rss(pid)
    # Signature headers present (they cannot be checked before the body): the declared length decides.
    status, sent = raw_post(rec.url, {**signed_headers(), "Content-Length": str(300 * 1024 * 1024)},
                            body_of(300 * 1024 * 1024))
    assert status == "HTTP/1.1 413 Request Entity Too Large" and sent < 32 * 1024 * 1024, (status, sent)
    # No length declared: reading stops at the limit, the rest of the chunked body is never read.
    status, sent = raw_post(rec.url, {**signed_headers(), "Transfer-Encoding": "chunked"},
                            body_of(300 * 1024 * 1024, chunked=True))
    assert status == "HTTP/1.1 413 Request Entity Too Large" and sent < 32 * 1024 * 1024, (status, sent)
    assert rss(pid) - before < 20 * 1024 * 1024
    # Under the limit, the same receiver still works.
    ok = httpx.post(rec.url, content=b"{}", headers=signed_headers(b"{}"), timeout=10)
    assert ok.status_code == 400, ok.text  # signed, but not an MLflow event


@pytest.mark.parametrize("payload", [
    b"[]", b'"text"', b"\xff\xfe not utf-8", b'{"entity": "model_version", "action": "created", "data": []}',
    b'{"entity": "model_version", "action": "created", "data": {"tags": "relctl.release"}}',
    b'{"entity": "model_version_tag", "action": "set", "data": {"key": ["relctl.release"], "value": "true"}}',
    b'{"entity": 7, "action": "created", "data": {}}',
])
def test_a_signed_malformed_payload_is_400(limited: tuple[Receiver, int], payload: bytes) -> None:
    rec, _ = limited
    response = httpx.post(rec.url, content=payload, headers=signed_headers(payload), timeout=10)
    assert response.status_code == 400, response.text
    assert response.json()["action"] == "ignored"


@pytest.mark.parametrize("run_id", ["--help", "-" + "a" * 31, "A" * 32, "../" + "a" * 29, "a" * 31 + "\n"])
def test_a_run_id_that_is_not_mlflows_starts_nothing(receiver: Receiver, run_id: str) -> None:
    before = len(receiver.starts())
    body, headers = mlflow_delivery("model_version", "created", created("inject", "1", run_id))
    response = post(receiver, body, headers)
    assert response.status_code == 200 and response.json()["action"] == "ignored", response.text
    assert "no source run to promote" in response.json()["reason"]
    assert len(wait_starts(receiver, before + 1, timeout_s=2)) == before


def test_the_default_command_ends_options_before_the_run_id(tmp_path: Path) -> None:
    from release.webhook.cli import default_command, fill
    from release.webhook.receiver import ReleaseRequest

    argv = fill(default_command(tmp_path), ReleaseRequest("m", "3", "a" * 32, "d"))
    assert argv[-2:] == ["--", "a" * 32] and argv[argv.index("promote") + 1:-2] == ["--model", "m", "--json"]
