"""A network that loses answers: the request reached the tracking server, its reply never came back.

MLflow's client retries such a request (RELCTL_REGISTRY_RETRIES), also when it was a create that the
server had already carried out. A real HTTP proxy on 127.0.0.1 forwards to the session's tracking
server and drops the reply of chosen requests once.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from release.registry import Registry
from release.registry.store import connect, resolve_store
from tests.scale.conftest import ScaleRegistry

Drop = Callable[[str, str, bytes], bool]
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


class LosingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, drop: Drop) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.drop, self.dropped = upstream, drop, 0
        self.lock = threading.Lock()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: LosingProxy

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        answer = httpx.request(self.command, self.server.upstream + self.path, content=body, headers=headers,
                               timeout=30)
        with self.server.lock:
            lose = self.server.dropped == 0 and self.server.drop(self.command, self.path, body)
            self.server.dropped += int(lose)
        if lose:  # the server did the work; the client hears nothing back
            self.close_connection = True
            return
        self.send_response(answer.status_code)
        for key, value in answer.headers.items():
            if key.lower() not in HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward

    def log_message(self, format: str, *args: object) -> None:  # quiet: the test reads its own assertions
        pass


@pytest.fixture()
def losing_proxy(scale_registry: ScaleRegistry) -> Iterator[Callable[[Drop], LosingProxy]]:
    started: list[LosingProxy] = []

    def start(drop: Drop) -> LosingProxy:
        proxy = LosingProxy(scale_registry.tracking_uri, drop)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.shutdown()
        proxy.server_close()


def _lock_create(method: str, path: str, body: bytes) -> bool:
    return method == "POST" and path.endswith("/registered-models/create") and b'"relctl.lock.' in body


def test_a_lost_answer_to_the_lease_create_does_not_make_relctl_wait_for_itself(
        losing_proxy: Callable[[Drop], LosingProxy], project_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = losing_proxy(_lock_create)
    for key, value in {"MLFLOW_TRACKING_URI": proxy.uri, "RELCTL_REGISTRY_RETRIES": "2",
                       "RELCTL_REGISTRY_BACKOFF_S": "0", "RELCTL_REGISTRY_TIMEOUT_S": "10"}.items():
        monkeypatch.setenv(key, value)
    for key in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(key, raising=False)
    store = resolve_store(project_dir)
    connect(store)
    registry = Registry(store)
    model = f"lost-answer-{secrets.token_hex(3)}"
    registry.ensure_model(model, "lost answers")
    source = registry.client.create_run(registry.client.create_experiment(model)).info.run_id
    registry.create_version(model, f"runs:/{source}/package", source, {}, "v1")
    started = time.monotonic()
    move = registry.move_aliases(model, {"production": "1"}, "promote", "through a lossy network", None)
    elapsed = time.monotonic() - started
    assert proxy.dropped == 1, "the proxy never dropped the lease's create: the test did not test anything"
    # Its own lease, created by the request whose answer was lost, is recognized as its own.
    assert elapsed < 30, f"the move waited {elapsed:.0f} s for a lease it held itself"
    assert move is not None and registry.aliases(model) == {"production": "1"}
    assert [m.state for m in registry.history(model)] == ["done"]
    assert not registry.client.search_registered_models(filter_string=f"name = 'relctl.lock.{model}'")
    assert json.loads(registry.history(model)[0].to_json())["changes"] == {"production": [None, "1"]}
