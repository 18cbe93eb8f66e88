"""Benchmark the canary: rollback time, false-alarm rate of an identical candidate, router overhead, and
how long `relctl canary --production-url A --candidate-url B` takes with its default steps and traffic.

Backends are tests/canary/backend.py (one process, known delays per URL), so the numbers are about
relctl's router and judge, not a model:
  rollback      a candidate with a per-token delay (6 ms vs 1 ms): time from the failed check to the
                router's candidate weight at 0 (in process), requests routed to the candidate after it,
                production's failed requests; plus the admin endpoint's round trip (POST /relctl/weights,
                HTTP from another process's view). Baseline: Flagger aborts after interval x threshold
                (its docs' example: 1 minute x 5 failed checks).
  false alarms  an identical candidate (same delays), default steps, rules and confidence (0.98), only
                the rate raised so 20+ runs fit; share of runs that do not pass (target < 5%).
  overhead      the bench client's same planned traffic direct to the backend and through the router (a
                process of its own, as deployed), alternating rounds; TTFT p50 and output tokens/s, and
                from the router's records its own forwarding lag and the backend's TTFT as it saw it.
  cli default   wall time of `relctl canary --production-url --candidate-url --json` with defaults.

    python benchmarks/canary.py                 # about 4 minutes
    python benchmarks/canary.py --runs 30 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from release.canary.runner import run_canary
from release.canary.settings import CanaryConfig
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.runner import Traffic, compare
from release.serving.loadgen.summary import SLOs
from tests.canary.backend import url

RESULTS = Path(__file__).parent / "results" / "canary.json"


@contextmanager
def process(args: list[str], tmp: Path, name: str) -> Iterator[str]:
    """A child that writes {"url": ...} to its ready file; yields the URL."""
    ready = tmp / f"{name}.json"
    proc = subprocess.Popen([sys.executable, *args, "--ready-file", str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start")
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        proc.wait(30)


def rollback(base: str, tmp: Path, runs: int) -> dict[str, Any]:
    config = CanaryConfig.model_validate({"steps": [25], "step_requests": 80, "after_rollback_s": 1.0,
                                          "traffic": {"rate": 60, "requests": 1, "output_tokens": 8}})
    times, after, prod_failures, client_failures = [], [], 0, 0
    for i in range(runs):
        result = run_canary(url(base, "1", 5, 1), url(base, "2", 5, 6), config, tmp / f"rollback-{i}")
        assert result.outcome == "fail", result.reason
        times.append(result.rollback_s or 0.0)
        after.append(result.candidate_after_rollback or 0)
        prod_failures += result.production_failures
        client_failures += result.client_failures
    return {"runs": runs, "rollback_ms_median": statistics.median(times) * 1000,
            "rollback_ms_max": max(times) * 1000, "candidate_requests_after_rollback": sum(after),
            "production_failed_requests": prod_failures, "client_failed_requests": client_failures,
            "baseline_flagger_s": 60 * 5, "baseline": "Flagger: analysis interval x failure threshold (1 min x 5)"}


def admin_round_trip(base: str, tmp: Path, n: int = 50) -> dict[str, Any]:
    args = ["-m", "release.serving.router", "--production", url(base, "1"), "--candidate", url(base, "2"),
            "--candidate-weight", "0.5"]
    with process(args, tmp, "router-admin") as router, httpx.Client() as client:
        samples = []
        for _ in range(n):
            client.post(f"{router}/relctl/weights", json={"candidate": 0.5})
            start = time.perf_counter()
            client.post(f"{router}/relctl/weights", json={"candidate": 0.0}).raise_for_status()
            samples.append(time.perf_counter() - start)
        # The next request after the answer goes to production.
        body = {"prompt": "hi", "max_tokens": 2}
        backends = {client.post(f"{router}/v1/completions", json=body, headers={"X-Request-Id": f"r{i}"}
                                ).headers["x-relctl-backend"] for i in range(20)}
    return {"admin_rollback_ms_p50": statistics.median(samples) * 1000,
            "admin_rollback_ms_max": max(samples) * 1000, "backends_after": sorted(backends)}


def false_alarms(base: str, tmp: Path, runs: int, rate: float) -> dict[str, Any]:
    defaults = CanaryConfig()
    config = defaults.model_copy(update={"traffic": defaults.traffic.model_copy(update={"rate": rate})})
    outcomes: dict[str, int] = {}
    failing_metrics: dict[str, int] = {}
    durations = []
    for i in range(runs):
        result = run_canary(url(base, "1", 5, 1), url(base, "2", 5, 1), config, tmp / f"identical-{i}")
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
        durations.append(result.duration_s)
        for check in result.checks:
            for m in check.judgement.metrics:
                if m.verdict != "pass":
                    failing_metrics[m.metric] = failing_metrics.get(m.metric, 0) + 1
    not_passed = runs - outcomes.get("pass", 0)
    return {"runs": runs, "confidence": config.confidence, "steps": config.steps,
            "step_requests": config.step_requests, "rate": rate, "outcomes": outcomes,
            "false_alarm_rate": not_passed / runs, "metric_checks_not_passed": failing_metrics,
            "run_s_median": statistics.median(durations), "target": "< 0.05"}


def overhead(base: str, tmp: Path, rounds: int, requests: int, rate: float) -> dict[str, Any]:
    backend = url(base, "1", 5, 2)
    records = tmp / "overhead-records.jsonl"
    args = ["-m", "release.serving.router", "--production", backend, "--candidate", url(base, "2", 5, 2),
            "--records", str(records)]
    traffic = Traffic(rate=rate, requests=requests, output_tokens=16, warmup=5)
    with process(args, tmp, "router-overhead") as router:
        endpoints = {"direct": ClientOptions(base_url=backend, model=None),
                     "router": ClientOptions(base_url=router, model=None)}
        rows: dict[str, list[dict[str, float]]] = {"direct": [], "router": []}
        for r in range(rounds):
            order = list(endpoints.items()) if r % 2 == 0 else list(reversed(endpoints.items()))
            runs, _, _ = compare(dict(order), traffic.model_copy(update={"seed": r}), SLOs())
            for run in runs:
                s = run.summary
                rows[run.label].append({
                    "ttft_p50_ms": s["ttft_ms"]["p50"], "tpot_p50_ms": s["tpot_ms"]["p50"],
                    "e2el_p50_ms": s["e2el_ms"]["p50"], "tokens_per_s": s["output_token_throughput"],
                    "errors": float(len(s["errors"]))})

    def med(side: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[side])

    out: dict[str, Any] = {"rounds": rounds, "requests": requests, "rate": rate, "per_round": rows}
    for key in ("ttft_p50_ms", "tpot_p50_ms", "e2el_p50_ms", "tokens_per_s"):
        out[key] = {"direct": med("direct", key), "router": med("router", key)}
    out["ttft_p50_added_ms"] = out["ttft_p50_ms"]["router"] - out["ttft_p50_ms"]["direct"]
    # Where the added time goes, from the router's own records: its work between a request's arrival and
    # forwarding it, and the backend's TTFT as the router saw it (the rest is the extra hop to the client).
    seen = [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []
    if seen:
        out["router_forward_lag_p50_ms"] = statistics.median(r["lag_s"] for r in seen) * 1000
        out["router_seen_backend_ttft_p50_ms"] = statistics.median(r["ttft_s"] for r in seen if r["ttft_s"]) * 1000
    out["tokens_per_s_change"] = out["tokens_per_s"]["router"] / out["tokens_per_s"]["direct"] - 1
    out["target"] = "< 1 ms added at p50"
    return out


def cli_default(base: str, tmp: Path) -> dict[str, Any]:
    (tmp / "cli").mkdir(exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "relctl"), "--project-dir", str(tmp / "cli"), "canary",
           "--production-url", url(base, "1"), "--candidate-url", url(base, "2"), "--json"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    if done.returncode not in (0, 1):
        raise SystemExit(f"relctl canary: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return {"exit_code": done.returncode, "wall_s": wall, "outcome": report.get("outcome"),
            "checks": len(report.get("checks", [])), "target": "< 120 s"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="identical-candidate canaries (false alarms)")
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s of the false-alarm runs")
    parser.add_argument("--rollbacks", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="direct/router rounds of the overhead run")
    parser.add_argument("--requests", type=int, default=300, help="requests per overhead round and side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        with process(["-m", "tests.canary.backend"], tmp, "backend") as base:
            started = time.perf_counter()
            result = {
                "rollback": {**rollback(base, tmp, args.rollbacks), **admin_round_trip(base, tmp)},
                "false_alarms": false_alarms(base, tmp, args.runs, args.rate),
                "router_overhead": overhead(base, tmp, args.rounds, args.requests, 25.0),
                "cli_default": cli_default(base, tmp),
            }
            result["wall_s"] = time.perf_counter() - started
    result["machine"] = {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
                         "note": "shared 2-core box: other engineers' work runs beside it"}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "router_overhead"} | {
        "router_overhead": {k: v for k, v in result["router_overhead"].items() if k != "per_round"}}, indent=2))


if __name__ == "__main__":
    main()
