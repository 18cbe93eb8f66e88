"""The intervals the paired comparison decides with (gates/paired.py), one function per kind of metric.

Binary: Newcombe's square-and-add interval for a difference of paired proportions, on the 2x2 table's four
cells. The cells may be real numbers, so gates/paired_power.py evaluates the same rule on an expected table
at another sample size.

Continuous: the widest of three intervals, each side on its own, and never a decision from fewer than
MIN_CONTINUOUS_ROWS rows (gates/paired.py):
- the seeded BCa bootstrap of the mean per-sample difference (resampling pairs);
- Student's t interval: the bootstrap's is too narrow with few rows (its spread has divisor n, not n - 1,
  and a normal quantile instead of t's), and it has no width at all when every difference is the same;
- on a metric with a known range (token_accuracy: [0, 1]), the **range floor** R·z²/(n + z²) on each side of
  the estimate: when no row is seen to differ, Wilson's bound on the share of rows that could still differ
  is z²/(n + z²), and each of them could differ by the whole range R. So a bounded metric is never more
  certain than a binary one on the same rows (exact match's Newcombe interval on 64 rows with none
  differing is about the same width). A metric with no known range has no such bound (no interval for the
  mean of an unbounded variable holds for every distribution: Bahadur & Savage 1956), so it rests on the
  bootstrap and t with at least MIN_CONTINUOUS_ROWS rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

# Enough resamples that the seeded interval's ends move by well under a percent of its width between
# seeds; the batch bounds memory (batch x n floats) for eval sets of tens of thousands of rows.
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_BATCH = 500


@dataclass(frozen=True)
class Table:
    """A paired 2x2 table: both right, only the candidate right, only the baseline right, neither."""

    both: float
    only_candidate: float
    only_baseline: float
    neither: float

    @property
    def n(self) -> float:
        return self.both + self.only_candidate + self.only_baseline + self.neither

    @classmethod
    def of(cls, cand: np.ndarray, base: np.ndarray) -> Table:
        a = int(np.sum((cand == 1) & (base == 1)))
        b = int(np.sum((cand == 1) & (base == 0)))
        c = int(np.sum((cand == 0) & (base == 1)))
        return cls(a, b, c, len(cand) - a - b - c)


def z_of(confidence: float) -> float:
    """The normal quantile of a two-sided interval at `confidence`."""
    return float(stats.norm.ppf(0.5 + confidence / 2))


def wilson(successes: float, n: float, z: float) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(max(0.0, p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)
    return centre - half, centre + half


def newcombe(table: Table, z: float) -> tuple[float, float]:
    """Newcombe's square-and-add interval on p(candidate) - p(baseline), with the continuity-corrected
    correlation (Newcombe 1998, method 10; recommended by Fagerland, Lydersen & Laake 2014)."""
    a, b, c, d = table.both, table.only_candidate, table.only_baseline, table.neither
    n = table.n
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else float(cross))
    phi = 0.0 if margins <= 0 else corrected / math.sqrt(margins)
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    epsilon = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    theta = p1 - p2
    return max(-1.0, theta - delta), min(1.0, theta + epsilon)


def mcnemar_p(table: Table) -> float:
    """The exact McNemar p-value on the discordant pairs (evidence of any difference; not the decision)."""
    b, c = int(table.only_candidate), int(table.only_baseline)
    return 1.0 if b + c == 0 else float(stats.binomtest(b, b + c, 0.5).pvalue)


def t_half_width(spread: float, n: int, confidence: float) -> float:
    """Student's t half-width for a mean of `n` values whose standard deviation is `spread`."""
    if n < 2:
        return 0.0
    return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * spread / math.sqrt(n)


def range_floor(width: float | None, n: int, z: float) -> float:
    """The least half-width on a metric whose values span `width` (None: no known range, no floor)."""
    return 0.0 if width is None else width * z * z / (n + z * z)


def bootstrap(differences: np.ndarray, confidence: float, seed: int) -> tuple[float, float]:
    """Seeded BCa bootstrap interval of the mean per-sample difference (resampling pairs)."""
    if np.ptp(differences) == 0:
        # Every pair differs by the same amount: every resample has that mean, and BCa's acceleration is
        # undefined (scipy would answer nan with a warning). The floors give it its width.
        value = float(differences[0])
        return value, value
    result = stats.bootstrap((differences,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, batch=BOOTSTRAP_BATCH,
                             confidence_level=confidence, method="BCa", random_state=np.random.default_rng(seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):  # BCa degenerate on very few distinct values
        result = stats.bootstrap((differences,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, batch=BOOTSTRAP_BATCH,
                                 confidence_level=confidence, method="percentile",
                                 random_state=np.random.default_rng(seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return low, high


@dataclass(frozen=True)
class ContinuousInterval:
    low: float
    high: float
    widest: str   # which interval set the wider side: "bootstrap", "t" or "range floor"


def continuous(differences: np.ndarray, width: float | None, confidence: float, seed: int) -> ContinuousInterval:
    """The widest of the BCa bootstrap, Student's t and the range floor, side by side (module docstring)."""
    n = len(differences)
    mean = float(np.mean(differences))
    spread = float(np.std(differences, ddof=1)) if n > 1 else 0.0
    boot_low, boot_high = bootstrap(differences, confidence, seed) if n > 1 else (mean, mean)
    t_half = t_half_width(spread, n, confidence)
    floor = range_floor(width, n, z_of(confidence))
    candidates = {"bootstrap": max(mean - boot_low, boot_high - mean), "t": t_half, "range floor": floor}
    low = min(boot_low, mean - t_half, mean - floor)
    high = max(boot_high, mean + t_half, mean + floor)
    if width is not None:  # a difference of values in a range of width R lies in [-R, R]
        low, high = max(low, -width), min(high, width)
    widest = max(candidates, key=lambda k: candidates[k])
    return ContinuousInterval(low, high, widest)
