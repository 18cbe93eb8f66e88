"""Arrival schedules: every send time is planned before the first request goes out (open loop)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from release.core.errors import InputError
from release.serving.loadgen.traces import Trace, load_trace, scale_trace

__all__ = ["ArrivalKind", "Trace", "load_trace", "plan_arrivals", "scale_trace"]

ArrivalKind = Literal["poisson", "gamma", "constant", "trace"]


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
