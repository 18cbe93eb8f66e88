"""`relctl webhook` under hostile clients, over real sockets on 127.0.0.1: a huge header line, a crowd of
slowloris connections (partial headers, never finished), a slow body, a deeply nested signed body and a
truncated state file. The receiver bounds header bytes, header time, body time, JSON depth and open
connections, and keeps answering health checks and signed deliveries meanwhile."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.test_webhook import Receiver, rss, signed_headers, start_receiver, stop

HEADER_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 32
NOWHERE = "http://127.0.0.1:9"   # the registry is never asked: these deliveries start nothing


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Receiver, int]]:
    proc, rec = start_receiver(tmp_path_factory.mktemp("guarded"), NOWHERE, "--max-connections", str(MAX_CONNECTIONS),
                               "--header-timeout", str(HEADER_TIMEOUT_S),
                               "--command", f"{sys.executable} -c pass {{run_id}}")
    try:
        yield rec, proc.pid
    finally:
        stop(proc)


def address(rec: Receiver) -> tuple[str, int]:
    host, port = rec.url.removeprefix("http://").rstrip("/").split(":")
    return host, int(port)


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed this connection (a read returns EOF or a reset)."""
    sock.settimeout(0.05)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_huge_header_line_is_refused_without_being_held(guarded: tuple[Receiver, int]) -> None:
    rec, pid = guarded
    before = rss(pid)
    sock = socket.create_connection(address(rec))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: relctl\r\nX-Junk: ")
    sent, chunk = 0, b"x" * 65536
    sock.settimeout(0.5)
    try:
        while sent < 300 * 1024 * 1024:
            sock.sendall(chunk)
            sent += len(chunk)
    except (TimeoutError, BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(5)
    try:
        answer = sock.recv(4096)
    except ConnectionResetError:
        answer = b""
    sock.close()
    assert sent < 16 * 1024 * 1024, sent   # cut off after the 16 KiB header bound, not read to 300 MB
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert rss(pid) - before < 20 * 1024 * 1024


def test_slowloris_connections_are_dropped_and_health_and_signed_deliveries_still_answer(
        guarded: tuple[Receiver, int]) -> None:
    rec, pid = guarded
    slow: list[socket.socket] = []
    try:
        for _ in range(200):   # far more than --max-connections: each sends a partial header and stalls
            sock = socket.create_connection(address(rec), timeout=5)
            sock.sendall(b"POST / HTTP/1.1\r\nHost: relctl\r\nX-Slow: ")
            slow.append(sock)
        # Meanwhile: health checks and a signed delivery are answered, each in well under the header timeout.
        with httpx.Client(timeout=10) as client:
            for _ in range(5):
                assert client.get(rec.url + "health").status_code == 200
                body = b"{}"
                signed = client.post(rec.url, content=body, headers=signed_headers(body))
                assert signed.status_code == 400, signed.text   # read and judged: signed, not an MLflow event
        open_fds = psutil.Process(pid).num_fds()
        assert open_fds < 200, open_fds   # the crowd does not hold one descriptor each
        time.sleep(HEADER_TIMEOUT_S + 2)
        still_open = [s for s in slow if not closed_by_server(s)]
        assert still_open == [], f"{len(still_open)} of {len(slow)} slow connections still open"
    finally:
        for sock in slow:
            sock.close()


def test_a_body_that_never_finishes_is_408(guarded: tuple[Receiver, int]) -> None:
    rec, _ = guarded
    body = b'{"entity": "model_version"}'
    sock = socket.create_connection(address(rec), timeout=HEADER_TIMEOUT_S + 10)
    head = "POST / HTTP/1.1\r\nHost: relctl\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in {**signed_headers(body), "Content-Length": str(len(body))}.items()) + "\r\n"
    sock.sendall(head.encode() + body[:5])
    started = time.monotonic()
    answer = sock.recv(4096)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 5


def test_a_deeply_nested_signed_body_is_400_not_502(guarded: tuple[Receiver, int]) -> None:
    rec, _ = guarded
    body = b"[" * 50_000 + b"]" * 50_000
    response = httpx.post(rec.url, content=body, headers=signed_headers(body), timeout=10)
    assert response.status_code == 400, response.text
    assert "nested" in response.json()["reason"]


def test_a_truncated_state_file_is_handled(tmp_path: Path) -> None:
    state = tmp_path / ".relctl" / "webhook"
    state.mkdir(parents=True)
    now = time.time()
    (state / "webhook-deliveries.jsonl").write_text(json.dumps({"id": "seen-before", "at": now}) + '\n{"id": "cut')
    proc, rec = start_receiver(tmp_path, NOWHERE, "--command", f"{sys.executable} -c pass {{run_id}}")
    try:
        assert proc.poll() is None and httpx.get(rec.url + "health", timeout=5).status_code == 200
        body = b"{}"
        replay = httpx.post(rec.url, content=body, headers=signed_headers(body, delivery_id="seen-before"),
                            timeout=10)
        assert replay.status_code == 401 and "replayed" in replay.text   # the intact entries still count
    finally:
        stop(proc)
    assert isinstance(proc, subprocess.Popen)
