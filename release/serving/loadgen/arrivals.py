"""Arrival schedules: every send time is planned before the first request goes out (open loop)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from release.errors import InputError

ArrivalKind = Literal["poisson", "gamma", "constant", "trace"]


@dataclass(frozen=True)
class Trace:
    """A replayed trace: send offsets (seconds from the first row) and each row's other fields."""

    offsets: np.ndarray
    rows: list[dict[str, Any]]

    @property
    def rate(self) -> float:
        span = float(self.offsets[-1] - self.offsets[0])
        return (len(self.offsets) - 1) / span if span > 0 else float("inf")


def plan_arrivals(kind: ArrivalKind, rate: float, n: int, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """`n` send offsets in seconds, the first at 0, spanning exactly (n - 1) / rate.

    Gaps are drawn (exponential for Poisson; Gamma with shape = burstiness and mean 1/rate, so
    burstiness < 1 is burstier than Poisson and 1 is Poisson) and then scaled to sum to (n - 1) / rate.
    That is the arrival process conditioned on its count, so the planned rate equals the target
    exactly and runs at one rate differ by their arrival shape only, not by sampling noise in the rate.
    """
    if rate <= 0:
        raise InputError(f"rate {rate}: must be positive", hint="pass --rate in requests per second, e.g. 10")
    if n < 1:
        raise InputError(f"requests {n}: must be at least 1", hint="pass --requests or a longer --duration")
    if n == 1:
        return np.zeros(1)
    rng = np.random.default_rng(seed)
    if kind == "constant":
        gaps = np.full(n - 1, 1.0)
    elif kind == "poisson":
        gaps = rng.exponential(1.0, n - 1)
    elif kind == "gamma":
        if burstiness <= 0:
            raise InputError(f"burstiness {burstiness}: must be positive", hint="1 is Poisson, 0.25 is bursty")
        gaps = rng.gamma(burstiness, 1.0 / burstiness, n - 1)
    else:
        raise InputError(f"arrival '{kind}': needs a trace file", hint="pass --trace FILE for trace replay")
    gaps *= ((n - 1) / rate) / gaps.sum()
    return np.concatenate([[0.0], np.cumsum(gaps)])


def load_trace(path: Path) -> Trace:
    """JSONL rows with a `timestamp` (seconds, any origin, non-decreasing after sorting)."""
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(_lines(path), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path.name}: line {number} is not JSON", hint="one JSON object per line") from exc
        stamp = row.get("timestamp") if isinstance(row, dict) else None
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise InputError(f"{path.name}: line {number} has no numeric 'timestamp'",
                             hint='rows look like {"timestamp": 0.25, "prompt": "...", "output_tokens": 64}')
        rows.append(row)
    if len(rows) < 2:
        raise InputError(f"{path.name}: a trace needs at least 2 rows", hint="record more requests")
    rows.sort(key=lambda r: float(r["timestamp"]))
    stamps = np.array([float(r["timestamp"]) for r in rows])
    return Trace(stamps - stamps[0], rows)


def scale_trace(trace: Trace, rate: float | None) -> np.ndarray:
    """The trace's offsets, compressed or stretched to `rate` (None: as recorded)."""
    if rate is None:
        return trace.offsets
    if rate <= 0:
        raise InputError(f"rate {rate}: must be positive", hint="omit --rate to replay the trace as recorded")
    return trace.offsets * (trace.rate / rate)


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="check the path")
    return [line for line in path.read_text().splitlines() if line.strip()]
