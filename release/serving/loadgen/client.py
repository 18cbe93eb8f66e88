"""The open-loop client. Send times come from a plan; every latency is measured from the planned time,
so a request the client sends late (its own lag, or waiting for a concurrency slot) is not excused
(no coordinated omission). Lag and client queue time are recorded separately for each request."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

from release.serving.loadgen.dataset import Sample

Endpoint = Literal["completions", "chat"]
# The event loop wakes timers up to ~1 ms late (epoll rounds timeouts up to whole milliseconds), so the
# dispatcher sleeps until this close to a send time and then yields to the loop until it is reached.
SPIN_S = 0.0011


@dataclass
class Record:
    """One request. Times in seconds; `scheduled_s`/`sent_s` are offsets from the start of the run."""

    index: int
    scheduled_s: float
    sent_s: float = 0.0
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


async def sleep_until(target: float) -> None:
    delay = target - time.perf_counter()
    if delay > SPIN_S:
        await asyncio.sleep(delay - SPIN_S)
    while time.perf_counter() < target:
        await asyncio.sleep(0)


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


async def run_schedule(offsets: np.ndarray, samples: list[Sample], opts: ClientOptions) -> list[Record]:
    """Send samples[i] at offsets[i] (seconds from now) and return one Record per request, in order."""
    connector = aiohttp.TCPConnector(limit=opts.max_concurrency or 0, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=opts.timeout_s)
    slots = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None
    records = [Record(i, float(offsets[i]), expected_output_tokens=s.output_tokens) for i, s in enumerate(samples)]
    bodies = [json.dumps(request_body(s, opts)).encode() for s in samples]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 20) as session:
        start = time.perf_counter() + 0.05
        tasks = []
        for rec, body in zip(records, bodies):
            planned = start + rec.scheduled_s
            await sleep_until(planned)
            rec.lag_s = time.perf_counter() - planned
            tasks.append(asyncio.create_task(_one(session, opts, rec, body, start, slots)))
        await asyncio.gather(*tasks)
    return records


async def _one(session: aiohttp.ClientSession, opts: ClientOptions, rec: Record, body: bytes, start: float,
               slots: asyncio.Semaphore | None) -> None:
    planned = start + rec.scheduled_s
    if slots is not None:
        waited = time.perf_counter()
        await slots.acquire()
        rec.queue_s = time.perf_counter() - waited
    try:
        sent = time.perf_counter()
        rec.sent_s = sent - start
        async with session.post(opts.url, data=body, headers={"Content-Type": "application/json"}) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                rec.status = _http_kind(resp.status)
                rec.error = (await resp.text())[:300]
                return
            if opts.stream:
                await _read_stream(resp, rec, planned)
            else:
                await _read_whole(resp, rec, planned)
    except TimeoutError:
        rec.status, rec.error = "timeout", f"no complete answer within {opts.timeout_s}s"
    except aiohttp.ClientConnectorError as exc:
        rec.status, rec.error = "connect", str(exc)[:300]
    except (aiohttp.ClientError, ValueError) as exc:
        rec.status, rec.error = "disconnect", f"{exc.__class__.__name__}: {exc}"[:300]
    finally:
        if slots is not None:
            slots.release()
    if rec.ok and rec.ttft_s is not None and rec.e2el_s is not None and rec.output_tokens > 1:
        rec.tpot_s = (rec.e2el_s - rec.ttft_s) / (rec.output_tokens - 1)


async def _read_stream(resp: aiohttp.ClientResponse, rec: Record, planned: float) -> None:
    last: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    async for raw in resp.content:
        now = time.perf_counter()
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        event = json.loads(payload)
        if "error" in event:
            rec.status, rec.error = "stream_error", str(event["error"])[:300]
            return
        if event.get("usage"):
            usage_tokens = event["usage"].get("completion_tokens")
            rec.prompt_tokens = event["usage"].get("prompt_tokens")
        if _chunk_text(event):
            chunks += 1
            if last is None:
                rec.ttft_s = now - planned
            else:
                rec.itl_s.append(now - last)
            last = now
    if last is None:
        rec.status, rec.error = "empty", "stream ended without any token"
        return
    rec.e2el_s = last - planned
    rec.output_tokens = usage_tokens if usage_tokens is not None else chunks
    rec.status = "ok"


async def _read_whole(resp: aiohttp.ClientResponse, rec: Record, planned: float) -> None:
    body = await resp.json()
    now = time.perf_counter()
    # Without streaming the first token is not observable: TTFT and TPOT stay unknown.
    rec.e2el_s = now - planned
    usage = body.get("usage") or {}
    rec.output_tokens = int(usage.get("completion_tokens", 0))
    rec.prompt_tokens = usage.get("prompt_tokens")
    rec.status = "ok"


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
