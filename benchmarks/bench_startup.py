"""Benchmark: how much CPU and wall time `relctl bench` spends before its first request reaches the endpoint.

A short CI load test pays this on every run, so it is measured the way a peer's is: a fresh interpreter
runs `relctl bench URL --requests 1` against benchmarks/loadgen_server.py (1 ms TTFT/TPOT), and the
parent polls the server's /stats until the first POST has arrived. At that moment it reads the child's
CPU seconds (user + system, /proc/PID/stat) and the wall time since the spawn (both clocks are the
machine's monotonic one, so the server's arrival stamp compares with the parent's). The floor beside it
is `python -c "import asyncio, numpy"` (what its client needs to plan and send at all); medians over --rounds (5)
go to benchmarks/results/bench_startup.json.

    python benchmarks/bench_startup.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "bench_startup.json"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def first_request(url: str, env: dict[str, str], out: Path) -> tuple[float, float]:
    """(wall seconds from spawn to the first request's arrival, the child's CPU seconds by then)."""
    httpx.post(f"{url}/reset")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", "from release.cli import main; main()", "bench", url,
                              "--requests", "1", "--out", str(out)], env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            arrivals = httpx.get(f"{url}/stats").json()["arrivals"]
            if arrivals:
                cpu = cpu_of(child.pid)
                return arrivals[0] - start, cpu
            if child.poll() is not None:
                raise SystemExit(f"relctl bench exited {child.returncode} before any request: "
                                 f"{child.stderr.read().decode()[-2000:] if child.stderr else ''}")
            time.sleep(0.005)
    finally:
        child.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", ""))
                                                        if p)}
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("loadgen_server.py")), str(ready)])
        try:
            deadline = time.monotonic() + 30
            while not ready.exists() or not ready.read_text():
                if time.monotonic() > deadline:
                    raise SystemExit("the delay server did not start")
                time.sleep(0.05)
            url = ready.read_text().strip()
            load_before = os.getloadavg()
            walls, cpus, floors = [], [], []
            for n in range(args.rounds):
                wall, cpu = first_request(url, env, Path(tmp) / f"out{n}")
                walls.append(wall)
                cpus.append(cpu)
                begin = time.perf_counter()
                subprocess.run([sys.executable, "-c", "import asyncio, numpy"], check=True)
                floors.append(time.perf_counter() - begin)
            load_after = os.getloadavg()
        finally:
            server.terminate()
            server.wait(timeout=10)
    result: dict[str, Any] = {
        "benchmark": "bench_startup",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in load_after]},
        "rounds": args.rounds,
        "median_wall_to_first_request_s": round(statistics.median(walls), 3),
        "median_cpu_to_first_request_s": round(statistics.median(cpus), 3),
        "median_floor_import_numpy_wall_s": round(statistics.median(floors), 3),
        "samples": {"wall": [round(x, 3) for x in walls], "cpu": [round(x, 3) for x in cpus],
                    "floor_wall": [round(x, 3) for x in floors]},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"relctl bench to its first request: wall {result['median_wall_to_first_request_s']:.3f} s, "
          f"cpu {result['median_cpu_to_first_request_s']:.3f} s (import asyncio, numpy: "
          f"{result['median_floor_import_numpy_wall_s']:.3f} s wall)")


if __name__ == "__main__":
    main()
