"""One benchmark run, a side-by-side compare of endpoints, and a sweep for the highest SLO-meeting rate.

Every run writes per-request records (JSONL); the caller decides where (`out_dir`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from release.errors import InputError
from release.serving.loadgen.arrivals import ArrivalKind, load_trace, plan_arrivals, scale_trace
from release.serving.loadgen.client import ClientOptions, Record, run_async, run_schedule
from release.serving.loadgen.dataset import Sample, draw_samples, load_dataset, parse_row, synthetic_dataset
from release.serving.loadgen.summary import SLOCheck, SLOs, check_slos, summarize


class Traffic(BaseModel):
    """What to send: arrival process, rate, request count and contents."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival: ArrivalKind = "poisson"
    rate: float | None = Field(default=4.0, gt=0, description="requests/s; with a trace: rescale it to this rate")
    burstiness: float = Field(default=1.0, gt=0, description="Gamma shape: 1 = Poisson, < 1 burstier")
    requests: int = Field(default=100, ge=1, le=1_000_000)
    trace: str | None = Field(default=None, description="JSONL with 'timestamp' per row (arrival: trace)")
    dataset: str | None = Field(default=None, description="JSONL of {prompt|messages, output_tokens}; default synthetic")
    output_tokens: int = Field(default=32, ge=1, description="output length for rows that give none")
    seed: int = 0
    warmup: int = Field(default=2, ge=0, description="requests sent (sequentially, unrecorded) before the run")


@dataclass
class RunResult:
    label: str
    url: str
    rate: float | None
    records: list[Record]
    summary: dict[str, Any]
    checks: list[SLOCheck]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "url": self.url, "rate": self.rate, "passed": self.passed,
                "summary": self.summary, "slo_checks": [asdict(c) for c in self.checks]}


@dataclass
class SweepResult:
    steps: list[RunResult] = field(default_factory=list)

    @property
    def best(self) -> RunResult | None:
        """The highest-rate step that met every SLO."""
        passing = [s for s in self.steps if s.passed and s.rate is not None]
        return max(passing, key=lambda s: s.rate or 0.0, default=None)


def plan_traffic(traffic: Traffic, rate: float | None = None, base_dir: Path | None = None) -> tuple[
    np.ndarray, list[Sample]
]:
    """Send offsets and request contents, both fixed before anything is sent."""
    rate = traffic.rate if rate is None else rate
    root = base_dir or Path(".")
    if traffic.arrival == "trace":
        if traffic.trace is None:
            raise InputError("arrival 'trace': no trace file given", hint="pass --trace FILE.jsonl")
        trace = load_trace(root / traffic.trace)
        offsets = scale_trace(trace, rate)
        pool = _pool(traffic, root, len(offsets))
        samples = [_trace_sample(row, i, traffic, pool) for i, row in enumerate(trace.rows)]
        return offsets, samples
    if rate is None:
        raise InputError(f"arrival '{traffic.arrival}': no rate given", hint="pass --rate N (requests/s)")
    offsets = plan_arrivals(traffic.arrival, rate, traffic.requests, traffic.seed, traffic.burstiness)
    return offsets, draw_samples(_pool(traffic, root, traffic.requests), traffic.requests, traffic.seed)


def _pool(traffic: Traffic, root: Path, n: int) -> list[Sample]:
    if traffic.dataset is not None:
        return load_dataset(root / traffic.dataset, traffic.output_tokens)
    return synthetic_dataset(max(64, min(n, 1000)), traffic.seed, output_tokens=(max(1, traffic.output_tokens // 4),
                                                                                  traffic.output_tokens))


def _trace_sample(row: dict[str, Any], i: int, traffic: Traffic, pool: list[Sample]) -> Sample:
    if "prompt" in row or "messages" in row:
        return parse_row(row, f"{traffic.trace}: row {i + 1}", traffic.output_tokens)
    return pool[i % len(pool)]


def run_one(label: str, opts: ClientOptions, offsets: np.ndarray, samples: list[Sample], slos: SLOs,
            rate: float | None, warmup: int) -> RunResult:
    """Warm the endpoint, then send the planned traffic once."""
    for i in range(warmup):
        run_async(run_schedule(np.zeros(1), [samples[i % len(samples)]], opts))
    records = run_async(run_schedule(offsets, samples, opts))
    summary = summarize(records, rate, slos)
    return RunResult(label, opts.url, rate, records, summary, check_slos(summary, slos))


def compare(endpoints: dict[str, ClientOptions], traffic: Traffic, slos: SLOs, base_dir: Path | None = None
            ) -> list[RunResult]:
    """The same planned traffic (times and contents) against each endpoint in turn."""
    offsets, samples = plan_traffic(traffic, base_dir=base_dir)
    rate = traffic.rate
    return [run_one(label, opts, offsets, samples, slos, rate, traffic.warmup) for label, opts in endpoints.items()]


def sweep(opts: ClientOptions, traffic: Traffic, slos: SLOs, step_duration_s: float = 10.0,
          rates: list[float] | None = None, max_steps: int = 8, refine: int = 3, min_requests: int = 20,
          base_dir: Path | None = None) -> SweepResult:
    """Find the highest rate meeting the SLOs: the given rates, or double from traffic.rate until a
    step fails, then bisect between the last passing and the first failing rate `refine` times."""
    result = SweepResult()

    def step(rate: float) -> bool:
        n = max(min_requests, round(rate * step_duration_s))
        offsets, samples = plan_traffic(traffic.model_copy(update={"requests": n}), rate, base_dir)
        run = run_one(f"rate-{rate:g}", opts, offsets, samples, slos, rate, traffic.warmup if not result.steps else 0)
        result.steps.append(run)
        return run.passed

    if rates:
        for rate in sorted(rates):
            step(rate)
        return result
    rate = traffic.rate or 1.0
    low, high = None, None
    for _ in range(max_steps):
        if step(rate):
            low, rate = rate, rate * 2
        else:
            high = rate
            break
    if low is None and high is not None:
        # Even the starting rate fails: search below it.
        for _ in range(max_steps):
            rate /= 2
            if step(rate):
                low = rate
                break
            high = rate
    if low is not None and high is not None:
        for _ in range(refine):
            mid = (low + high) / 2
            low, high = (mid, high) if step(mid) else (low, mid)
    return result


def write_records(path: Path, records: list[Record]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_json(), separators=(",", ":")) + "\n")
    tmp.rename(path)
    return path


def write_json(path: Path, data: Any) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float))
    tmp.rename(path)
    return path
