"""Benchmark: requests/s of an engine alone against the same engine behind `relctl serve` and behind relctl's
router, on the same seeded plan (issue 27, step 4: each row of the engines table is limited by the engine,
not by relctl; target: behind >= 0.9x alone).

For each engine (vLLM, llama.cpp), one random Llama (hidden 512 over 4 heads: head_dim 128, which vLLM's CPU
attention takes; 4 layers, 256 positions: big enough that the engine's work, not the Python around it, sets
the rate, as with any real model) is built and packaged, and one `relctl serve` started with release.yaml's
defaults; it starts the engine behind it (vLLM's OpenAI server, llama-server). The same seeded plan (Poisson
arrivals at 100 req/s, 120 requests of 16 output tokens: faster than the engine finishes them, so the
engine's capacity decides the rate) is then sent ROUNDS times, interleaved, to three paths on that one warmed
engine: the engine's own server alone, `relctl serve` in front of it, and relctl's router (its own process,
as the canary runs it) in front of `relctl serve`. Each path's better run counts (the machine is shared: a
path's worse run is someone else's load); every run is recorded, with the load average before and after.

tests/backends/test_vllm_admission.py asserts the same paths run every request without a refusal; the rate
ratio is a measurement on shared cores, so it lives here and in benchmarks/results/router_capacity.json.

    python benchmarks/router_capacity.py                   # both engines, ~5 minutes on 2 shared cores
    python benchmarks/router_capacity.py --engines llama-cpp --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from release.backends import get_backend
from release.backends.llama_cpp.server import THREADS_ENV
from release.backends.processes import engine_log_path
from release.core.package import build_package
from release.core.server_settings import ServerSettings
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.runner import RunResult, Traffic, plan_traffic, run_one
from release.serving.loadgen.summary import SLOs
from release.serving.process import ServerProcess
from tests.serving.tinymodel import build_hf_model

RESULTS = Path(__file__).parent / "results" / "router_capacity.json"
CONTEXT = 256
PLAN = Traffic(arrival="poisson", rate=100, requests=120, output_tokens=16, seed=7, warmup=2)
TARGET = 0.9
# Each engine's package at the precision it serves the example at, and where its engine logs (log_path).
ENGINES = {"vllm": ("fp32", "vllm"), "llama-cpp": ("fp16", "llama-cpp")}
ENGINE_NAME = "engine"  # the name both runners start their engine under (release/backends/*/runner.py)


def package_for(engine: str, checkpoint: Path, root: Path) -> Path:
    backend = get_backend(engine)
    precision = ENGINES[engine][0]
    (root / "model").mkdir(parents=True)
    backend.export(checkpoint, root / "model", precision, "cpu", root / "export.log")
    fields = {"model_name": "capacity", "precision": precision, "lineage": {}, "serving": {}}  # defaults
    build_package(root / "package", root / "model", checkpoint, fields, backend)
    return root / "package"


def engine_behind(engine: str, server: ServerProcess) -> str:
    """The URL of the engine `relctl serve` started: its log is serve-<pid>-<port>.log
    (release/backends/processes.py engine_log_path), so the same warmed engine is measured alone too."""
    logs = list(engine_log_path(ENGINES[engine][1], "serve", 0).parent.glob(f"serve-{server.pid}-*.log"))
    if len(logs) != 1:
        raise SystemExit(f"{engine}: expected one engine log of relctl serve {server.pid}, found {logs}")
    return f"http://127.0.0.1:{logs[0].stem.rsplit('-', 1)[1]}"


@contextmanager
def router_process(url: str, work: Path) -> Iterator[str]:
    """relctl's router as the canary runs it, production and candidate both `url`."""
    ready = work / "router-ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "release.serving.router", "--production", url, "--candidate",
                             url, "--ready-file", str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the router did not start")
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        proc.wait(30)


def in_flight_cap(engine: str) -> int | None:
    """At most twice what the engine schedules at once in flight (None: no cap below the plan's requests): the
    engine is saturated (as many wait as run), and no path's bounded queue refuses what another path's unbounded
    one holds: llama-server queues without limit and times requests out, relctl answers 429 beyond
    serving.server.queue_size. vLLM schedules 128 at once, more than the plan sends: no cap, as the test."""
    limit = get_backend(engine).admission_limit(ServerSettings()) or ServerSettings().workers
    return None if 2 * limit >= PLAN.requests else 2 * limit


def saturate(url: str, model: str | None, cap: int | None) -> RunResult:
    offsets, samples = plan_traffic(PLAN, max_model_len=CONTEXT)
    return run_one(url, ClientOptions(url, model, timeout_s=120, max_concurrency=cap), offsets, samples, SLOs(),
                   PLAN.rate, PLAN.warmup)


def measure(engine: str, checkpoint: Path, root: Path, rounds: int) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    package = package_for(engine, checkpoint, root)
    runs: dict[str, list[dict[str, Any]]] = {"alone": [], "relctl": [], "router": []}
    cap = in_flight_cap(engine)
    load_before = os.getloadavg()
    with ServerProcess(str(package), root / "serve") as server, router_process(server.url, root) as router:
        urls = {"alone": (engine_behind(engine, server), ENGINE_NAME), "relctl": (server.url, None),
                "router": (router, None)}
        for _ in range(rounds):
            for path, (url, model) in urls.items():
                summary = saturate(url, model, cap).summary
                runs[path].append({"requests_per_s": round(float(summary["request_throughput"]), 3),
                                   "requests": summary["requests"], "errors": summary["errors"]})
                print(f"{engine} {path}: {runs[path][-1]}", flush=True)
    best = {path: max(r["requests_per_s"] for r in done) for path, done in runs.items()}
    ratios = {f"{path}/alone": round(best[path] / best["alone"], 3) for path in ("relctl", "router")}
    refused = {path: sum(int(r["errors"].get("http_429", 0)) for r in done) for path, done in runs.items()}
    return {"precision": ENGINES[engine][0], "client_in_flight_cap": cap, "best_requests_per_s": best, "ratios": ratios,
            "meets_target": all(v >= TARGET for v in ratios.values()), "refused_429": refused, "runs": runs,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs per path")
    parser.add_argument("--llama-threads", default="1",
                        help="llama-server's --threads (RELCTL_LLAMA_CPP_THREADS; 'default': llama.cpp's own)")
    args = parser.parse_args()
    if args.llama_threads != "default":
        os.environ[THREADS_ENV] = args.llama_threads
    out: dict[str, Any] = {
        "benchmark": "requests/s of each engine alone vs behind relctl serve vs behind relctl's router, same "
                     "seeded plan on one warmed engine, best of the interleaved rounds per path",
        "plan": {"arrival": PLAN.arrival, "rate": PLAN.rate, "requests": PLAN.requests,
                 "output_tokens": PLAN.output_tokens, "seed": PLAN.seed, "warmup": PLAN.warmup},
        "model": f"random Llama, hidden 512, 4 heads (head_dim 128), 4 layers, {CONTEXT} positions",
        "target": f"behind >= {TARGET}x alone", "rounds": args.rounds, "engines": {},
        "engine_settings": {THREADS_ENV: os.environ.get(THREADS_ENV, "llama.cpp's default")},
        "machine": {"cpus": os.cpu_count(), "shared": "yes: other jobs ran on the same cores (see loadavg)"},
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = build_hf_model(root / "hf", hidden=512, layers=4, context=CONTEXT)
        for engine in args.engines:
            out["engines"][engine] = measure(engine, checkpoint, root / engine, args.rounds)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    for engine, row in out["engines"].items():
        print(f"{engine}: best req/s {row['best_requests_per_s']}, ratios {row['ratios']}, 429s {row['refused_429']}")


if __name__ == "__main__":
    main()
