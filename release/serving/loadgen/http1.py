"""A lean HTTP/1.1 client on asyncio protocols: keep-alive connections, prebuilt requests, callbacks.

Why not aiohttp: at thousands of requests per second a general client's per-request coroutines, header
objects and stream readers cost ~1 ms of CPU each, which is the whole budget of a core at 1,000 req/s.
Here a request is one `transport.write` of prebuilt bytes and the response is parsed in
`data_received` (status line, headers, Content-Length, chunked or read-to-close bodies), with each piece
of body handed to a sink stamped with the time its bytes arrived. What it does not do: redirects,
proxies, cookies, HTTP/2; a load generator posting to one endpoint needs none of them.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Protocol
from urllib.parse import urlparse

MAX_HEAD = 65536


class Sink(Protocol):
    """Receives one response. Exactly one of `on_end` or `on_fail` is called, last. `over`: the
    request ended on the client's side (a timeout); nothing more is sent for it."""

    over: bool

    def on_sent(self, now: float, conn: Connection) -> None: ...
    def on_status(self, status: int, now: float) -> None: ...
    def on_data(self, data: bytes, now: float) -> None: ...
    def on_end(self, now: float) -> None: ...
    def on_fail(self, kind: str, message: str) -> None: ...


class Endpoint:
    """Where requests go and how each is framed: `request(body)` is the whole request as bytes."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parsed = urlparse(url)
        self.tls = parsed.scheme == "https"
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or (443 if self.tls else 80)
        path = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = (f"POST {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Type: application/json\r\n"
                      f"Accept: application/json, text/event-stream\r\n{extra}Content-Length: ").encode()

    def request(self, body: bytes) -> bytes:
        return b"%s%d\r\n\r\n%s" % (self._head, len(body), body)


class Pool:
    """Keep-alive connections to one endpoint, opened on demand and reused most-recent first."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[Connection] = []  # closed ones are skipped when popped, not searched for
        self._all: set[Connection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._ssl = ssl.create_default_context() if endpoint.tls else None

    def send(self, data: bytes, sink: Sink) -> None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                conn.start(data, sink, reused=True)
                return
        task = asyncio.get_running_loop().create_task(self._open_and_send(data, sink))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _open_and_send(self, data: bytes, sink: Sink) -> None:
        # No wait_for around the connect (it costs a second task per connection, and connections are
        # opened in bursts when a server slows down): the request's own timeout covers a hung connect.
        ep = self.endpoint
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: Connection(self), ep.host, ep.port, ssl=self._ssl,
                server_hostname=ep.host if self._ssl else None)
        except (OSError, ssl.SSLError) as exc:
            sink.on_fail("connect", f"{ep.host}:{ep.port}: {exc.__class__.__name__}: {exc}"[:300])
            return
        if sink.over:  # it timed out while connecting: keep the connection, send nothing
            self.release(conn)
            return
        conn.start(data, sink, reused=False)

    def release(self, conn: Connection) -> None:
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self._all.discard(conn)

    def track(self, conn: Connection) -> None:
        self._all.add(conn)

    def close(self) -> None:
        for task in list(self._connecting):
            task.cancel()
        for conn in list(self._all):
            conn.close()
        self._idle.clear()


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE = range(7)


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.buf = bytearray()
        self.state = _HEAD
        self.remaining = 0
        self.keep_alive = True
        self.got_bytes = False
        self.reused = False
        self.data = b""

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.pool.track(self)

    def start(self, data: bytes, sink: Sink, reused: bool) -> None:
        self.sink, self.data, self.reused, self.got_bytes = sink, data, reused, False
        self.state, self.keep_alive = _HEAD, True
        self.buf.clear()
        sink.on_sent(time.perf_counter(), self)
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        """Drop the response in progress (a timeout): its sink hears nothing more."""
        self.sink = None
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.sink is None:
            return
        self.got_bytes = True
        self.buf += data
        try:
            self._parse(now)
        except ValueError as exc:
            self._fail("protocol", f"unparsable HTTP response: {exc}")

    def _parse(self, now: float) -> None:
        buf = self.buf
        while self.sink is not None:
            if self.state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise ValueError("header block over 64 KiB")
                    return
                head = bytes(buf[:end]).decode("latin-1")
                del buf[:end + 4]
                self._start_body(head, now)
            elif self.state == _LENGTH or self.state == _CHUNK_DATA:
                take = min(self.remaining, len(buf))
                if take == 0 and self.remaining:
                    return
                if take:
                    self.sink.on_data(bytes(buf[:take]), now)
                    del buf[:take]
                    self.remaining -= take
                if self.remaining == 0:
                    if self.state == _LENGTH:
                        self._finish(now)
                    else:
                        self.state = _CHUNK_END
            elif self.state == _CHUNK_SIZE or self.state == _CHUNK_END or self.state == _TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[:end + 2]
                if self.state == _CHUNK_END:
                    self.state = _CHUNK_SIZE
                elif self.state == _CHUNK_SIZE:
                    self.remaining = int(line.split(b";", 1)[0].strip(), 16)
                    self.state = _CHUNK_DATA if self.remaining else _TRAILER
                elif not line:
                    self._finish(now)
            else:  # _TO_CLOSE: the body ends when the server closes the connection
                if buf:
                    self.sink.on_data(bytes(buf), now)
                    buf.clear()
                return

    def _start_body(self, head: str, now: float) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.keep_alive = parts[0] != "HTTP/1.0" and headers.get("connection", "").lower() != "close"
        assert self.sink is not None
        self.sink.on_status(status, now)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif "content-length" in headers:
            self.state, self.remaining = _LENGTH, int(headers["content-length"])
        elif status in (204, 304) or 100 <= status < 200:
            self.state, self.remaining = _LENGTH, 0
        else:
            self.state, self.keep_alive = _TO_CLOSE, False

    def _finish(self, now: float) -> None:
        sink, self.sink = self.sink, None
        self.state = _HEAD
        if self.keep_alive and self.usable:
            self.pool.release(self)
        else:
            self.close()
        if sink is not None:
            sink.on_end(now)

    def _fail(self, kind: str, message: str) -> None:
        sink, self.sink = self.sink, None
        self.close()
        if sink is not None:
            sink.on_fail(kind, message[:300])

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        self.transport = None
        sink = self.sink
        if sink is None:
            return
        if self.state == _TO_CLOSE:
            self._finish(time.perf_counter())
        elif self.reused and not self.got_bytes:
            # The server closed an idle keep-alive connection as the request went out: nothing was
            # processed, so sending it again on a fresh connection is safe.
            self.sink = None
            self.pool.send(self.data, sink)
        else:
            self._fail("disconnect", f"connection closed mid-response{f': {exc}' if exc else ''}")
