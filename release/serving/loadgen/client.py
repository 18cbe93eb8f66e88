"""The open-loop client. Send times come from a plan; every latency is measured from the planned time,
so a request the client sends late (its own lag, or waiting for a concurrency slot) is not excused
(no coordinated omission). Lag and client queue time are recorded separately for each request.

The dispatcher sleeps in the event loop until the next planned time (a timerfd wakes it on Linux, see
timer.py), then sends every request that is due; each is one write of prebuilt bytes (http1.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from release.serving.loadgen.dataset import Sample
from release.serving.loadgen.http1 import Connection, Pool
from release.serving.loadgen.http1 import Endpoint as HttpEndpoint
from release.serving.loadgen.timer import WakeTimer

Endpoint = Literal["completions", "chat"]
SWEEP_S = 0.1  # how often requests past their timeout are ended: timeouts are exact to 0.1 s
T = TypeVar("T")


@dataclass
class Record:
    """One request. Times in seconds; `scheduled_s`/`sent_s` are offsets from the start of the run."""

    index: int                  # position in the plan (the whole plan, also when run as one segment)
    scheduled_s: float
    sent_s: float = 0.0         # when its bytes were written (after any --max-concurrency wait)
    lag_s: float = 0.0          # dispatch time - planned time: the client's own lateness
    queue_s: float = 0.0        # waiting for a --max-concurrency slot
    ttft_s: float | None = None
    e2el_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    expected_output_tokens: int = 0
    status: str = "pending"     # ok, or an error kind: http_429, http_4xx, http_5xx, timeout, connect, ...
    http_status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClientOptions:
    base_url: str               # http://host:port or http://host:port/v1
    model: str | None
    endpoint: Endpoint = "completions"
    stream: bool = True
    ignore_eos: bool = True
    max_concurrency: int | None = None
    timeout_s: float = 60.0
    temperature: float = 0.0

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        return f"{base}/chat/completions" if self.endpoint == "chat" else f"{base}/completions"


def sse_event(line: bytes) -> dict[str, Any] | None:
    """The JSON of one `data:` line of an OpenAI-style SSE stream; None for other lines and `[DONE]`."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return None
    event: dict[str, Any] = json.loads(payload)
    return event


def request_body(sample: Sample, opts: ClientOptions) -> dict[str, Any]:
    body = sample.chat_body() if opts.endpoint == "chat" else sample.completion_body()
    body.update(max_tokens=sample.output_tokens, temperature=opts.temperature, stream=opts.stream)
    if opts.model:
        body["model"] = opts.model
    if opts.ignore_eos:
        body["ignore_eos"] = True
    if opts.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a fresh event loop: uvloop's when installed (less CPU per callback), else asyncio's."""
    try:
        import uvloop  # noqa: PLC0415 - optional: the client runs on asyncio's loop without it
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def run_schedule(offsets: np.ndarray, samples: list[Sample], opts: ClientOptions,
                       indices: list[int] | None = None, start: float | None = None) -> list[Record]:
    """Send samples[i] at offsets[i] (seconds from `start`, a perf_counter time; default: 50 ms from now)
    and return one Record per request, in order. `indices` are the plan positions the records carry
    (a segment of a larger plan); default 0..n-1."""
    run = _Run(offsets, samples, opts, indices, start)
    try:
        await run.done
    finally:
        run.close()
    return run.records


class _Run:
    """One schedule in flight: the dispatcher, the concurrency cap, and the count of unfinished requests."""

    def __init__(self, offsets: np.ndarray, samples: list[Sample], opts: ClientOptions,
                 indices: list[int] | None, start: float | None) -> None:
        loop = asyncio.get_running_loop()
        self.opts = opts
        endpoint = HttpEndpoint(opts.url)
        self.pool = Pool(endpoint)
        positions = indices if indices is not None else range(len(samples))
        self.records = [Record(int(p), float(o), expected_output_tokens=s.output_tokens)
                        for p, o, s in zip(positions, offsets, samples, strict=True)]
        self.requests = [endpoint.request(json.dumps(request_body(s, opts)).encode()) for s in samples]
        # The clock starts once every request is built: building 10,000 bodies takes a good part of a second.
        self.start = time.perf_counter() + 0.05 if start is None else start
        self.planned = [self.start + float(o) for o in offsets]
        self.next = 0
        self.unfinished = len(self.records)
        self.in_flight = 0
        self.active: set[_Exchange] = set()
        self.waiting: deque[_Exchange] = deque()
        self.done: asyncio.Future[None] = loop.create_future()
        self.timer = WakeTimer(loop, self._dispatch)
        # One periodic sweep for timeouts instead of a timer per request (each costs a timer handle).
        self.sweeper = loop.call_later(SWEEP_S, self._sweep)
        if self.unfinished == 0:
            self.done.set_result(None)
        else:
            self.timer.arm(self.planned[0])

    def _dispatch(self) -> None:
        now = time.perf_counter()
        limit = self.opts.max_concurrency
        n = len(self.planned)
        # Everything already due goes out in this wake-up, in plan order; nothing is sent early.
        while self.next < n and self.planned[self.next] <= now:
            i = self.next
            self.next += 1
            rec = self.records[i]
            rec.lag_s = now - self.planned[i]
            exchange = _Exchange(self, rec, self.planned[i], self.requests[i])
            if limit is not None and self.in_flight >= limit:
                exchange.waited_from = now
                self.waiting.append(exchange)
            else:
                self._start(exchange)
            now = time.perf_counter()
        if self.next < n:
            self.timer.arm(self.planned[self.next])

    def _start(self, exchange: _Exchange) -> None:
        self.in_flight += 1
        exchange.deadline = time.perf_counter() + self.opts.timeout_s
        self.active.add(exchange)
        self.pool.send(exchange.request, exchange)

    def _sweep(self) -> None:
        now = time.perf_counter()
        for exchange in [e for e in self.active if e.deadline <= now]:
            exchange.on_timeout()
        self.sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    def finished(self, exchange: _Exchange) -> None:
        self.active.discard(exchange)
        self.in_flight -= 1
        self.unfinished -= 1
        if self.waiting:
            exchange = self.waiting.popleft()
            exchange.rec.queue_s = time.perf_counter() - exchange.waited_from
            self._start(exchange)
        if self.unfinished == 0 and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        self.sweeper.cancel()
        self.timer.close()
        self.pool.close()


class _Exchange:
    """One request's response, parsed as it arrives; fills its Record (implements http1.Sink)."""

    def __init__(self, run: _Run, rec: Record, planned: float, request: bytes) -> None:
        self.run, self.rec, self.planned, self.request = run, rec, planned, request
        self.waited_from = 0.0
        self.deadline = float("inf")
        self.body = bytearray()
        self.partial = b""
        self.last: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.over = False
        self.conn: Connection | None = None

    def on_sent(self, now: float, conn: Connection) -> None:
        self.rec.sent_s = now - self.run.start
        self.conn = conn

    def on_status(self, status: int, now: float) -> None:
        self.rec.http_status = status

    def on_data(self, data: bytes, now: float) -> None:
        if self.over:
            return
        if self.rec.http_status != 200 or not self.run.opts.stream:
            self.body += data
            return
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            self._event(line.strip(), now)

    def _event(self, line: bytes, now: float) -> None:
        event = None if self.over else sse_event(line)
        if event is None:
            return
        if "error" in event:
            self._close("stream_error", str(event["error"])[:300])
            return
        if event.get("usage"):
            self.usage_tokens = event["usage"].get("completion_tokens")
            self.rec.prompt_tokens = event["usage"].get("prompt_tokens")
        if _chunk_text(event):
            self.chunks += 1
            if self.last is None:
                self.rec.ttft_s = now - self.planned
            else:
                self.rec.itl_s.append(now - self.last)
            self.last = now

    def on_end(self, now: float) -> None:
        if self.over:
            return
        rec = self.rec
        status = rec.http_status or 0
        if status != 200:
            self._close(_http_kind(status), self.body[:300].decode(errors="replace"))
            return
        if not self.run.opts.stream:
            try:
                usage = json.loads(self.body).get("usage") or {}
            except (ValueError, AttributeError):
                self._close("disconnect", "response body is not a JSON object")
                return
            # Without streaming the first token is not observable: TTFT and TPOT stay unknown.
            rec.e2el_s = now - self.planned
            rec.output_tokens = int(usage.get("completion_tokens", 0))
            rec.prompt_tokens = usage.get("prompt_tokens")
            self._close("ok", None)
            return
        if self.partial.strip():
            self._event(self.partial.strip(), now)
        if self.over:
            return
        if self.last is None:
            self._close("empty", "stream ended without any token")
            return
        rec.e2el_s = self.last - self.planned
        rec.output_tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        if rec.ttft_s is not None and rec.output_tokens > 1:
            rec.tpot_s = (rec.e2el_s - rec.ttft_s) / (rec.output_tokens - 1)
        self._close("ok", None)

    def on_fail(self, kind: str, message: str) -> None:
        self._close(kind, message)

    def on_timeout(self) -> None:
        if not self.over:
            self._close("timeout", f"no complete answer within {self.run.opts.timeout_s}s")
            if self.conn is not None:
                self.conn.abort()  # the server sees the client leave and can stop generating

    def _close(self, status: str, error: str | None) -> None:
        if self.over:
            return
        self.over = True
        self.rec.status, self.rec.error = status, error
        self.run.finished(self)


def _chunk_text(event: dict[str, Any]) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return str((choice["delta"] or {}).get("content") or "")
    return str(choice.get("text") or "")


def _http_kind(status: int) -> str:
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"
