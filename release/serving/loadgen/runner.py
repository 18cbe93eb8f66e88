"""One benchmark run, a side-by-side compare of endpoints, and a sweep for the highest SLO-meeting rate.

Every run writes per-request records (JSONL); the caller decides where (`out_dir`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from release.core.errors import InputError
from release.serving.loadgen.arrivals import ArrivalKind, load_trace, plan_arrivals, scale_trace
from release.serving.loadgen.client import ClientOptions, Record, run_async, run_schedule
from release.serving.loadgen.context import check_fit, prompt_budget
from release.serving.loadgen.dataset import (
    Sample,
    draw_samples,
    load_dataset,
    parse_row,
    prompt_of_length,
    synthetic_dataset,
)
from release.serving.loadgen.segments import Segment, plan_digest, start_offset
from release.serving.loadgen.summary import SLOCheck, SLOs, check_slos, summarize


class Traffic(BaseModel):
    """What to send: arrival process, rate, request count and contents."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival: ArrivalKind = "poisson"
    rate: float | None = Field(default=4.0, gt=0, description="requests/s; with a trace: rescale it to this rate")
    burstiness: float = Field(default=1.0, gt=0, description="Gamma shape: 1 = Poisson, < 1 burstier")
    requests: int = Field(default=100, ge=1, le=1_000_000)
    trace: str | None = Field(default=None, description="trace file (arrival: trace): relctl/Mooncake JSONL, "
                              "a relctl serve request log, bench or router records, or an Azure CSV")
    dataset: str | None = Field(default=None,
                                description="JSONL of {prompt|messages, output_tokens}; default synthetic")
    output_tokens: int = Field(default=32, ge=1, description="output tokens of every synthetic request and of "
                               "dataset or trace rows that give none")
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
    # The best step sent again, same seeded plan, right after the sweep: its spread from the first is the
    # repeat noise of this endpoint on this machine now (an engines table calls rows within it a tie).
    repeat: RunResult | None = None
    stopped: str | None = None   # why the sweep ended early (its max_duration_s), when it did

    @property
    def best(self) -> RunResult | None:
        """The highest-rate step that met every SLO."""
        passing = [s for s in self.steps if s.passed and s.rate is not None]
        return max(passing, key=lambda s: s.rate or 0.0, default=None)


def plan_traffic(traffic: Traffic, rate: float | None = None, base_dir: Path | None = None,
                 max_model_len: int | None = None, endpoint: str = "completions") -> tuple[np.ndarray, list[Sample]]:
    """Send offsets and request contents, both fixed before anything is sent.

    `max_model_len` (the endpoint's context, when it reports one): synthetic prompts are sized to fit
    it with their output tokens, and a dataset or trace row that cannot fit is an InputError.
    """
    rate = traffic.rate if rate is None else rate
    root = base_dir or Path(".")
    if traffic.arrival == "trace":
        if traffic.trace is None:
            raise InputError("arrival 'trace': no trace file given", hint="pass --trace FILE")
        trace = load_trace(root / traffic.trace)
        offsets = scale_trace(trace, rate)
        pool = _pool(traffic, root, len(offsets), max_model_len, endpoint)
        samples = [_trace_sample(row, i, traffic, pool) for i, row in enumerate(trace.rows)]
        if max_model_len is not None:
            check_fit(samples, max_model_len)
        return offsets, samples
    if rate is None:
        raise InputError(f"arrival '{traffic.arrival}': no rate given", hint="pass --rate N (requests/s)")
    offsets = plan_arrivals(traffic.arrival, rate, traffic.requests, traffic.seed, traffic.burstiness)
    pool = _pool(traffic, root, traffic.requests, max_model_len, endpoint)
    return offsets, draw_samples(pool, traffic.requests, traffic.seed)


def _pool(traffic: Traffic, root: Path, n: int, max_model_len: int | None, endpoint: str) -> list[Sample]:
    if traffic.dataset is not None:
        rows = load_dataset(root / traffic.dataset, traffic.output_tokens)
        if max_model_len is not None:
            check_fit(rows, max_model_len)
        return rows
    cap = None if max_model_len is None else prompt_budget(max_model_len, traffic.output_tokens, endpoint)
    return synthetic_dataset(max(64, min(n, 1000)), traffic.seed, output_tokens=traffic.output_tokens,
                             max_prompt_chars=cap)


def _trace_sample(row: dict[str, Any], i: int, traffic: Traffic, pool: list[Sample]) -> Sample:
    where = f"{traffic.trace}: row {i + 1}"
    if "prompt" in row or "messages" in row:
        return parse_row(row, where, traffic.output_tokens)
    output = row.get("output_tokens") or traffic.output_tokens
    if row.get("input_tokens") is not None:
        tokens = max(1, int(row["input_tokens"]))
        return Sample(prompt_of_length(tokens, i), None, int(output), prompt_tokens=tokens, source=where)
    return replace(pool[i % len(pool)], output_tokens=int(output), source=where)


def run_one(label: str, opts: ClientOptions, offsets: np.ndarray, samples: list[Sample], slos: SLOs,
            rate: float | None, warmup: int, segment: Segment | None = None,
            start_at: float | None = None) -> RunResult:
    """Warm the endpoint, then send the planned traffic once (only `segment`'s share of it, if given),
    starting at the Unix time `start_at` (default: now)."""
    indices = segment.indices(len(offsets)) if segment is not None else list(range(len(offsets)))
    mine = [samples[i] for i in indices]
    for i in range(warmup):
        run_async(run_schedule(np.zeros(1), [mine[i % len(mine)] if mine else samples[0]], opts))
    start = None if start_at is None else time.perf_counter() + start_offset(start_at)
    records = run_async(run_schedule(offsets[indices], mine, opts, indices=indices, start=start))
    share = None if rate is None or segment is None else rate / segment.count
    summary = summarize(records, rate if segment is None else share, slos)
    return RunResult(label, opts.url, rate, records, summary, check_slos(summary, slos))


def compare(endpoints: dict[str, ClientOptions], traffic: Traffic, slos: SLOs, base_dir: Path | None = None,
            max_model_len: int | None = None, segment: Segment | None = None, start_at: float | None = None
            ) -> tuple[list[RunResult], str, int]:
    """The same planned traffic (times and contents) against each endpoint in turn; with the plan's
    digest and size (segments.py)."""
    endpoint = next(iter(endpoints.values())).endpoint if endpoints else "completions"
    offsets, samples = plan_traffic(traffic, base_dir=base_dir, max_model_len=max_model_len, endpoint=endpoint)
    rate = traffic.rate
    runs = [run_one(label, opts, offsets, samples, slos, rate, traffic.warmup, segment, start_at)
            for label, opts in endpoints.items()]
    return runs, plan_digest(offsets, samples), len(offsets)


MIN_STEP_REQUESTS = 20  # a step's percentiles need this many requests, however low its rate


def step_seconds(rate: float, step_duration_s: float, min_requests: int = MIN_STEP_REQUESTS) -> float:
    """How long one sweep step at `rate` sends for: max(min_requests, rate x step_duration_s) requests at `rate`
    (at 0.001 req/s, 20 requests take 20000 s, whatever step_duration_s says)."""
    return max(min_requests, round(rate * step_duration_s)) / rate


def planned_sweep_s(rates: Sequence[float], step_duration_s: float) -> float:
    """The sending time of a sweep over the given rates (warm-up and the engine's own time not counted)."""
    return sum(step_seconds(r, step_duration_s) for r in rates)


class _OutOfTime(Exception):
    """The next step would end past the sweep's max_duration_s."""


def sweep(opts: ClientOptions, traffic: Traffic, slos: SLOs, step_duration_s: float = 10.0,
          rates: list[float] | None = None, max_steps: int = 8, refine: int = 3, min_requests: int = MIN_STEP_REQUESTS,
          base_dir: Path | None = None, max_model_len: int | None = None, repeat_best: bool = False,
          max_duration_s: float | None = None) -> SweepResult:
    """Find the highest rate meeting the SLOs: the given rates, or double from traffic.rate until a
    step fails, then bisect between the last passing and the first failing rate `refine` times.
    `repeat_best`: send the best step's plan once more (SweepResult.repeat). `max_duration_s`: no step starts
    that would end past it (its planned sending time counted); the sweep stops there and says so (`stopped`)."""
    result = SweepResult()
    started = time.monotonic()

    def run_step(rate: float, label: str) -> RunResult:
        if max_duration_s is not None:
            need = step_seconds(rate, step_duration_s, min_requests)
            if time.monotonic() - started + need > max_duration_s:
                result.stopped = (f"stopped before the step at rate {rate:g} (it sends for {need:.0f}s): the sweep's "
                                  f"cap is max_duration_s {max_duration_s:g}s")
                raise _OutOfTime
        n = max(min_requests, round(rate * step_duration_s))
        offsets, samples = plan_traffic(traffic.model_copy(update={"requests": n}), rate, base_dir, max_model_len,
                                        opts.endpoint)
        return run_one(label, opts, offsets, samples, slos, rate, traffic.warmup if not result.steps else 0)

    def step(rate: float) -> bool:
        run = run_step(rate, f"rate-{rate:g}")
        result.steps.append(run)
        return run.passed

    try:
        _search(step, rates, traffic.rate or 1.0, max_steps, refine)
    except _OutOfTime:
        return result
    best = result.best
    if repeat_best and best is not None and best.rate is not None:
        result.repeat = run_step(best.rate, f"rate-{best.rate:g}-repeat")
    return result


def _search(step: Callable[[float], bool], rates: list[float] | None, start: float, max_steps: int,
            refine: int) -> None:
    """The sweep's search: each rate given, or doubling from `start` to the first failing step, then bisection."""
    if rates:
        for rate in sorted(rates):
            step(rate)
        return
    rate = start
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


def write_records(path: Path, records: Sequence[Any]) -> Path:
    """Per-request records (anything with to_json()) as JSONL, written to a temporary name first so a reader
    never sees half a file. The canary router's records use the same writer."""
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
