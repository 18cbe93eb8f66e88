"""Benchmark: how fast relctl bench's open-loop client can send and still keep to its plan, beside
locust on the same endpoint in the same run.

A trivial OpenAI-style endpoint (one SSE chunk per request, no model) runs in its own process. For each
rate, each tool sends rate x --seconds requests at constant spacing:
  relctl  release.serving.loadgen.client.run_schedule (planned send times; lag = actual - planned)
  locust  FastHttpUser with constant_throughput, in its own process (gevent); its plan is each user's
          regular grid from its first request (locust paces closed-loop per user and has no global plan)
Lag is |actual - planned| send time. The capacity of a tool is the highest rate whose p99 lag is within
1 ms of plan with no errors (also reported at p50).
A third row per rate, the no-request floor, runs the same plan with nothing but the dispatcher's sleeps:
on a busy shared machine the OS alone makes some wake-ups late, and no client can be closer than that.
Results: benchmarks/results/loadgen.json (with the load average: the machine may be shared).

    python benchmarks/loadgen.py                       # rates 50..3200
    python benchmarks/loadgen.py --rates 100,200 --seconds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results" / "loadgen.json"
LAG_BOUND_MS = 1.0

LOCUSTFILE = '''
import json, os, time
from locust import FastHttpUser, constant_throughput, events, task

RATE = float(os.environ["BENCH_USER_RATE"])
STAMPS = {}

class Client(FastHttpUser):
    wait_time = constant_throughput(RATE)

    @task
    def complete(self):
        STAMPS.setdefault(id(self), []).append(time.perf_counter())
        self.client.post("/v1/completions", data=b'{"prompt": "hi", "max_tokens": 1, "stream": true}',
                         headers={"Content-Type": "application/json"})

@events.test_stop.add_listener
def dump(environment, **kwargs):
    with open(os.environ["BENCH_STAMPS"], "w") as fh:
        json.dump(list(STAMPS.values()), fh)
'''


def serve(ready: Path) -> None:
    """The trivial endpoint: answers every completion with one streamed token."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    body = b'data: {"choices":[{"index":0,"text":"x"}]}\n\ndata: [DONE]\n\n'

    async def complete(request: Request) -> Response:
        await request.body()
        return Response(body, media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", access_log=False,
                                           backlog=4096))

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        ready.write_text(f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}")
        await task

    asyncio.run(main())


def lag_stats(lags_s: list[float], sent: int, span_s: float, errors: int, rate: float) -> dict[str, Any]:
    # Early is off plan too: locust's pacing runs ahead of its grid at times (relctl is never early).
    lags = np.abs(np.asarray(lags_s)) * 1000.0
    return {"rate": rate, "requests": sent, "errors": errors,
            "achieved_rate": (sent - 1) / span_s if span_s > 0 else None,
            "lag_p50_ms": float(np.percentile(lags, 50)), "lag_p99_ms": float(np.percentile(lags, 99)),
            "lag_max_ms": float(lags.max())}


def run_relctl(url: str, rate: float, seconds: float) -> dict[str, Any]:
    from release.serving.loadgen.arrivals import plan_arrivals
    from release.serving.loadgen.client import ClientOptions, run_schedule
    from release.serving.loadgen.dataset import Sample

    n = int(rate * seconds)
    opts = ClientOptions(base_url=url, model=None, ignore_eos=False, timeout_s=30)
    records = asyncio.run(run_schedule(plan_arrivals("constant", rate, n, 0), [Sample("hi", None, 1)] * n, opts))
    sent = sorted(r.scheduled_s + r.lag_s for r in records)
    return lag_stats([r.lag_s for r in records], n, sent[-1] - sent[0], sum(not r.ok for r in records), rate)


def run_floor(rate: float, seconds: float) -> dict[str, Any]:
    """The machine's own floor: the same plan with no request at all, only the dispatcher's sleeps."""
    from release.serving.loadgen.client import sleep_until

    async def plan() -> list[float]:
        n = int(rate * seconds)
        start = time.perf_counter() + 0.05
        lags = []
        for i in range(n):
            planned = start + i / rate
            await sleep_until(planned)
            lags.append(time.perf_counter() - planned)
        return lags

    lags = asyncio.run(plan())
    return lag_stats(lags, len(lags), (len(lags) - 1) / rate, 0, rate)


def run_locust(url: str, rate: float, seconds: float, work: Path) -> dict[str, Any]:
    users = max(4, int(rate // 50))
    stamps_file = work / "stamps.json"
    locustfile = work / "locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    env = {**os.environ, "BENCH_USER_RATE": str(rate / users), "BENCH_STAMPS": str(stamps_file)}
    cmd = [shutil.which("locust") or "locust", "-f", str(locustfile), "--headless", "-u", str(users),
           "-r", str(users), "-t", f"{max(1, round(seconds))}s", "--host", url, "--only-summary", "--loglevel", "ERROR",
           "--csv", str(work / "locust")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=seconds + 60)
    if not stamps_file.is_file():
        raise RuntimeError(f"locust wrote no stamps: {done.stderr[-1000:]}")
    per_user = json.loads(stamps_file.read_text())
    lags, everything = [], []
    for stamps in per_user:
        # Each user's plan: a regular grid from its first request at its share of the rate.
        period = users / rate
        lags += [s - (stamps[0] + k * period) for k, s in enumerate(stamps)]
        everything += stamps
    everything.sort()
    failures = _locust_failures(work / "locust_stats.csv")
    return lag_stats(lags, len(everything), everything[-1] - everything[0], failures, rate) | {"users": users}


def _locust_failures(path: Path) -> int:
    import csv

    with path.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["Name"] == "Aggregated"]
    return int(rows[0]["Failure Count"]) if rows else 0


def capacity(rows: list[dict[str, Any]], stat: str = "lag_p99_ms") -> float | None:
    ok = [r["rate"] for r in rows if r[stat] <= LAG_BOUND_MS and r["errors"] == 0]
    return max(ok, default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="50,100,200,400,800,1600,2400,3200")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ready = work / "ready"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(ready)])
        try:
            while not ready.is_file():
                time.sleep(0.05)
            url = ready.read_text()
            run_relctl(url, 50.0, 0.5)  # warm imports, connections and the endpoint
            load_before = os.getloadavg()
            relctl, locust, floor = [], [], []
            for rate in rates:
                floor.append(run_floor(rate, args.seconds))
                relctl.append(run_relctl(url, rate, args.seconds))
                locust.append(run_locust(url, rate, args.seconds, work))
                print(f"rate {rate:>6g}: lag p99 relctl {relctl[-1]['lag_p99_ms']:7.2f} ms, "
                      f"locust {locust[-1]['lag_p99_ms']:7.2f} ms, no-request floor {floor[-1]['lag_p99_ms']:7.2f} ms",
                      flush=True)
        finally:
            server.terminate()
            server.wait(30)
    result = {
        "benchmark": "load generator scheduling capacity on a trivial endpoint",
        "criterion": f"p99 send lag <= {LAG_BOUND_MS} ms and no errors",
        "relctl_max_rate": capacity(relctl), "locust_max_rate": capacity(locust),
        "floor_max_rate": capacity(floor),
        "at_p50": {"relctl_max_rate": capacity(relctl, "lag_p50_ms"), "locust_max_rate": capacity(locust, "lag_p50_ms")},
        "relctl": relctl, "locust": locust, "no_request_floor": floor, "seconds_per_rate": args.seconds,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("criterion", "relctl_max_rate", "locust_max_rate", "floor_max_rate",
                                             "at_p50")}, indent=2))


if __name__ == "__main__":
    main()
