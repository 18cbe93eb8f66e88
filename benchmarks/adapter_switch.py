"""Benchmark: switching an adapter's version on a live base under load, against the same server under the same
load with no switch, and against switches with no load.

    python benchmarks/adapter_switch.py --project-dir P --base tiny-llm --model tiny-llm-support --versions 1 2 \
        [--code DIR ...] [--requests 10000] [--clients 6] [--pause 0.2] [--idle-switches 20]

P is a project whose base (BASE@production) has the adapter's two versions released onto it (the story of
tests/adapters/test_ort_adapters.py leaves one). For this checkout, and for each `--code DIR` (another
checkout first on the import path, e.g. an older commit: "before"), it starts `relctl serve BASE@production
--adapters` on P and measures, in this order:

  baseline   REQUESTS one-token completions to the adapter from CLIENTS concurrent clients, no switch;
  switching  the same while an admin client switches the adapter between the two versions, waiting PAUSE
             seconds after each switch's answer;
  idle       IDLE_SWITCHES switches with no traffic.

Recorded per code: requests/s and every status (a failed request is anything but 200), how many requests each
version answered, and the switch seconds as the server timed them (its answer's `seconds`: fetch, checks and the
engine load) and as the client saw them. A code that takes one key for everything (before the admin key) is
driven with its completions key. JSON to benchmarks/results/adapter_switch.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import httpx

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "adapter_switch.json"
RELCTL = str(Path(sys.executable).with_name("relctl"))
KEY, ADMIN_KEY = "bench-completions-key", "bench-admin-key"
PROMPT = "reverse b d a f ->"


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"n": len(ordered), "min": round(ordered[0], 3), "median": round(statistics.median(ordered), 3),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3), "max": round(ordered[-1], 3)}


async def drive(url: str, model: str, admin: str, versions: list[str] | None, args: argparse.Namespace
                ) -> dict[str, Any]:
    """REQUESTS completions from CLIENTS clients; with `versions`, switched between them all along."""
    statuses: Counter[int] = Counter()
    answered: Counter[str] = Counter()
    failures: list[str] = []
    server_s: list[float] = []
    client_s: list[float] = []
    left = args.requests
    done = asyncio.Event()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=args.clients + 1),
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
                    text = await r.text()
                    statuses[r.status] += 1
                    if r.status == 200:
                        answered[r.headers.get("X-Relctl-Adapter-Version", "?")] += 1
                    elif len(failures) < 3:
                        failures.append(f"HTTP {r.status}: {text[:200]}")

        async def switcher(order: list[str]) -> None:
            while not done.is_set():
                started = time.monotonic()
                version = order[len(server_s) % 2]
                async with session.post("/admin/adapters", json={"model": model, "version": version},
                                        headers={"Authorization": f"Bearer {admin}"}) as r:
                    answer = await r.json()
                    if r.status != 200:
                        raise SystemExit(f"switch to v{version}: HTTP {r.status}: {answer}")
                server_s.append(float(answer["seconds"]))
                client_s.append(time.monotonic() - started)
                await asyncio.sleep(args.pause)

        switching = asyncio.create_task(switcher(versions)) if versions else None
        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        elapsed = time.monotonic() - started
        done.set()
        if switching is not None:
            await switching
    return {"requests": sum(statuses.values()), "seconds": round(elapsed, 2),
            "requests_per_s": round(sum(statuses.values()) / elapsed, 1), "statuses": dict(statuses),
            "failed": sum(n for s, n in statuses.items() if s != 200), "first_failures": failures,
            "answered_by_version": dict(answered), "switches": len(server_s),
            "switch_server_s": spread(server_s), "switch_round_trip_s": spread(client_s)}


def idle_switches(url: str, model: str, admin: str, versions: list[str], n: int) -> dict[str, Any]:
    server_s, client_s = [], []
    with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {admin}"}) as http:
        for i in range(n):   # one client: a new one per request would time its TLS context set-up too
            started = time.monotonic()
            r = http.post("/admin/adapters", json={"model": model, "version": versions[i % 2]})
            r.raise_for_status()
            client_s.append(time.monotonic() - started)
            server_s.append(float(r.json()["seconds"]))
    return {"switch_server_s": spread(server_s), "switch_round_trip_s": spread(client_s)}


def measure(code: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code), "RELCTL_API_KEY": KEY, "RELCTL_ADMIN_KEY": ADMIN_KEY}
    with tempfile.TemporaryDirectory(prefix="adapter-switch-") as tmp:
        ready = Path(tmp) / "ready.json"
        log = (Path(tmp) / "serve.log").open("wb")
        server = subprocess.Popen([RELCTL, "serve", f"{args.base}@production", "--adapters", "--port", "0",
                                   "--project-dir", str(args.project_dir), "--ready-file", str(ready)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 300
            while not ready.is_file():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"relctl serve ({code}) did not start: "
                                     f"{(Path(tmp) / 'serve.log').read_text()[-1000:]}")
                time.sleep(0.2)
            url = json.loads(ready.read_text())["url"]
            listed = httpx.get(f"{url}/admin/adapters", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
            admin = ADMIN_KEY if listed.status_code == 200 else KEY   # a code from before the admin key
            order = [v for v in args.versions]
            row = {"code": str(code), "admin_key": admin == ADMIN_KEY,
                   "baseline": asyncio.run(drive(url, args.model, admin, None, args)),
                   "switching": asyncio.run(drive(url, args.model, admin, order, args)),
                   "idle": idle_switches(url, args.model, admin, order, args.idle_switches)}
            httpx.post(f"{url}/admin/adapters", json={"model": args.model}, timeout=300,
                       headers={"Authorization": f"Bearer {admin}"}).raise_for_status()   # back to production
            return row
        finally:
            server.terminate()
            server.wait(60)
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-dir", type=Path, required=True)
    parser.add_argument("--base", required=True, help="the base's registered model (served at its production)")
    parser.add_argument("--model", required=True, help="the adapter's registered model")
    parser.add_argument("--versions", nargs=2, required=True, metavar=("A", "B"), help="two servable versions")
    parser.add_argument("--code", type=Path, action="append", default=[],
                        help="another checkout to measure the same way (repeatable); this one is always measured")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between a switch's answer and the next")
    parser.add_argument("--idle-switches", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [measure(code, args) for code in [REPO, *[c.resolve() for c in args.code]]]
    record = {"benchmark": "adapter version switches on a live base under load (one-token completions), against "
                           "the same load without switches and switches without load",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_before": [round(x, 2) for x in load_before],
                          "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
              "plan": {"requests": args.requests, "clients": args.clients, "pause_s": args.pause,
                       "idle_switches": args.idle_switches, "model": args.model, "versions": args.versions},
              "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
