"""Metrics of one run, with the exact definitions of docs/metrics.md, and SLO checks on them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from release.serving.loadgen.client import Record

PERCENTILES = (50, 90, 95, 99)


class SLOs(BaseModel):
    """Service-level objectives. Percentile bounds judge a run; per-request bounds define goodput."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p95_ms: float | None = Field(default=None, gt=0)
    ttft_p99_ms: float | None = Field(default=None, gt=0)
    tpot_p95_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    e2el_p95_ms: float | None = Field(default=None, gt=0)
    e2el_p99_ms: float | None = Field(default=None, gt=0)
    max_error_rate: float | None = Field(default=0.01, ge=0, le=1)
    min_goodput_rps: float | None = Field(default=None, ge=0, description="requests/s meeting every per-request SLO")
    # A request counts toward goodput when it succeeded and met each of these that is set.
    request_ttft_ms: float | None = Field(default=None, gt=0)
    request_tpot_ms: float | None = Field(default=None, gt=0)
    request_e2el_ms: float | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class SLOCheck:
    metric: str
    value: float | None
    op: Literal["<=", ">="]
    bound: float
    passed: bool


def distribution(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p95/p99 and mean in milliseconds (None when there is no value)."""
    if not values:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None}
    arr = np.asarray(values) * 1000.0
    out: dict[str, float | None] = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def met_request_slos(rec: Record, slos: SLOs) -> bool:
    if not rec.ok:
        return False
    for bound, value in ((slos.request_ttft_ms, rec.ttft_s), (slos.request_tpot_ms, rec.tpot_s),
                         (slos.request_e2el_ms, rec.e2el_s)):
        if bound is not None and value is not None and value * 1000.0 > bound:
            return False
    return True


def sent_time(rec: Record) -> float:
    """When the request's bytes went out (offset from the run's start); planned + lag if never sent."""
    return rec.sent_s if rec.sent_s > 0 else rec.scheduled_s + rec.lag_s


def summarize(records: list[Record], target_rate: float | None, slos: SLOs) -> dict[str, Any]:
    """The run's metrics; duration runs from the first planned send to the last answer."""
    ok = [r for r in records if r.ok]
    ends = [r.scheduled_s + (r.e2el_s or 0.0) for r in records]
    duration = max(max(ends, default=0.0), max((r.sent_s for r in records), default=0.0)) or float("nan")
    # Achieved rate from when requests actually went out (after any --max-concurrency wait), not from
    # when the dispatcher handled them: that is the rate the server received.
    sent = sorted(sent_time(r) for r in records)
    span = sent[-1] - sent[0] if len(sent) > 1 else 0.0
    output_tokens = sum(r.output_tokens for r in ok)
    errors = Counter(r.status for r in records if not r.ok)
    return {
        "requests": len(records),
        "completed": len(ok),
        "errors": dict(sorted(errors.items())),
        "error_rate": (len(records) - len(ok)) / len(records) if records else 0.0,
        "duration_s": duration,
        "target_rate": target_rate,
        "achieved_rate": (len(sent) - 1) / span if span > 0 else None,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": output_tokens / duration,
        "goodput_rps": sum(met_request_slos(r, slos) for r in records) / duration,
        "output_tokens": output_tokens,
        "ttft_ms": distribution([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": distribution([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_ms": distribution([gap for r in ok for gap in r.itl_s]),
        "e2el_ms": distribution([r.e2el_s for r in ok if r.e2el_s is not None]),
        "client_lag_ms": {**distribution([r.lag_s for r in records]), "max": max(r.lag_s for r in records) * 1e3},
        "client_queue_ms": distribution([r.queue_s for r in records]),
    }


def check_slos(summary: dict[str, Any], slos: SLOs) -> list[SLOCheck]:
    """One check per SLO that is set; a missing measurement fails its check."""
    checks = []
    for metric in ("ttft", "tpot", "e2el"):
        for pct in ("p95", "p99"):
            bound = getattr(slos, f"{metric}_{pct}_ms")
            if bound is not None:
                value = summary[f"{metric}_ms"][pct]
                checks.append(SLOCheck(f"{metric}_{pct}_ms", value, "<=", bound, value is not None and value <= bound))
    if slos.max_error_rate is not None:
        rate = float(summary["error_rate"])
        checks.append(SLOCheck("error_rate", rate, "<=", slos.max_error_rate, rate <= slos.max_error_rate))
    if slos.min_goodput_rps is not None:
        good = float(summary["goodput_rps"])
        checks.append(SLOCheck("goodput_rps", good, ">=", slos.min_goodput_rps, good >= slos.min_goodput_rps))
    return checks
