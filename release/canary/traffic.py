"""The canary's traffic: the load generator's open-loop arrivals and dataset, sent through the router
continuously across steps (a check never pauses the traffic), each request with its own X-Request-Id.

Rows of the dataset that carry an `expected` answer are sent without ignore_eos (the answer must end
where the model ends it) and feed the output-quality metric; the others keep the load generator's
controlled output lengths.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from release.core.errors import InputError
from release.core.jsonfile import read_jsonl
from release.serving.loadgen.arrivals import plan_arrivals
from release.serving.loadgen.client import ClientOptions, request_body, run_async
from release.serving.loadgen.dataset import Sample, parse_row, synthetic_dataset
from release.serving.loadgen.runner import Traffic


@dataclass(frozen=True)
class CanaryRequest:
    request_id: str
    sample: Sample
    expected: str | None


@dataclass
class ClientView:
    """What the user (the client) saw of one request: who answered, and the answer."""

    request_id: str
    status: int | None = None
    backend: str | None = None
    version: str | None = None
    text: str = ""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_rows(path: Path, default_output_tokens: int) -> list[tuple[Sample, str | None]]:
    """Dataset rows as the load generator reads them, plus each row's `expected` answer when it has one."""
    if not path.is_file():
        raise InputError(f"{path}: no such dataset file", hint="set gates.canary.traffic.dataset to a JSONL file")
    rows = []
    for number, row in read_jsonl(path, hint="one JSON object per line"):
        sample = parse_row(row, f"{path.name}: line {number}", default_output_tokens)
        expected = row.get("expected")
        rows.append((sample, expected if isinstance(expected, str) else None))
    if not rows:
        raise InputError(f"{path.name}: no rows",
                         hint='one JSON object per line, e.g. {"prompt": "...", "expected": "..."}')
    return rows


def plan_requests(traffic: Traffic, n: int, tag: str, base_dir: Path | None) -> tuple[np.ndarray, list[CanaryRequest]]:
    """`n` send offsets (the configured arrival process and rate) and the requests, fixed in advance."""
    if traffic.arrival == "trace":
        raise InputError("gates.canary: trace arrivals are not supported (a canary runs until its checks end)",
                         hint="use arrival: poisson, gamma or constant with a rate")
    if traffic.rate is None:
        raise InputError("gates.canary.traffic: no rate", hint="set traffic.rate in requests per second")
    offsets = plan_arrivals(traffic.arrival, traffic.rate, n, traffic.seed, traffic.burstiness)
    if traffic.dataset is not None:
        root = base_dir or Path(".")
        pool = load_rows(root / traffic.dataset, traffic.output_tokens)
    else:
        lengths = (max(1, traffic.output_tokens // 4), traffic.output_tokens)
        pool = [(s, None) for s in synthetic_dataset(64, traffic.seed, output_tokens=lengths)]
    rng = np.random.default_rng(traffic.seed + 1)
    picks = rng.integers(0, len(pool), size=n)
    return offsets, [CanaryRequest(f"{tag}-{i}", *pool[int(p)]) for i, p in enumerate(picks)]


async def sleep_until(target: float) -> None:
    """Sleep in the event loop until perf_counter() reaches `target` (a few hundred microseconds late at
    most: the canary compares two sides under the same schedule, it does not need the bench's precision)."""
    delay = target - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def body_for(request: CanaryRequest, opts: ClientOptions) -> bytes:
    body = request_body(request.sample, opts)
    if request.expected is not None:
        body.pop("ignore_eos", None)
        body["temperature"] = 0.0
    return json.dumps(body).encode()


class TrafficDriver:
    """Sends the planned requests on schedule from a background thread until the plan ends or stop()."""

    def __init__(self, opts: ClientOptions, offsets: np.ndarray, requests: list[CanaryRequest],
                 keep_text: bool = False) -> None:
        self.opts = opts
        self.offsets = offsets
        self.requests = requests
        self.keep_text = keep_text
        self.views: list[ClientView] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: run_async(self._run()), name="relctl-canary-traffic",
                                        daemon=True)

    @property
    def exhausted(self) -> bool:
        return not self._thread.is_alive() or self.sent >= len(self.requests)

    def start(self) -> TrafficDriver:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Send nothing more; wait for the requests in flight to finish."""
        self._stop.set()
        self._thread.join(timeout_s)

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.opts.timeout_s)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1 << 20) as session:
            start = time.perf_counter() + 0.02
            tasks = []
            for offset, request in zip(self.offsets, self.requests, strict=True):
                if self._stop.is_set():
                    break
                await sleep_until(start + float(offset))
                if self._stop.is_set():
                    break
                view = ClientView(request.request_id)
                self.views.append(view)
                tasks.append(asyncio.create_task(self._one(session, request, view)))
                self.sent += 1
            await asyncio.gather(*tasks)

    async def _one(self, session: aiohttp.ClientSession, request: CanaryRequest, view: ClientView) -> None:
        headers = {"Content-Type": "application/json", "X-Request-Id": request.request_id}
        try:
            async with session.post(self.opts.url, data=body_for(request, self.opts), headers=headers) as resp:
                view.status = resp.status
                view.backend = resp.headers.get("X-Relctl-Backend")
                view.version = resp.headers.get("X-Relctl-Version")
                payload = await resp.read()
                if self.keep_text:
                    view.text = payload.decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            view.error = f"{exc.__class__.__name__}: {exc}"[:300]
