"""How many samples would decide an underpowered comparison, at POWER (80 %): the smallest N at which the
decision rule itself (gates/paired_intervals.py) would decide on the data one should expect at N.

The observed proportions (binary) or the observed mean and spread of the differences (continuous) are taken
as the truth. At N, the estimated difference is spread around the truth with standard error SE(N); with
probability POWER it lands no further than z_β·SE(N) on the unfavourable side (z_β = Φ⁻¹(POWER) = 0.84).
So N decides with that power when the rule decides on the data whose difference sits there:

- binary: the expected 2x2 table at N, moved by z_β·SE(N) along the difference (b - c), each cell by its
  regression on b - c under the multinomial (the cell's expected count given that difference). A cell seen
  empty stays empty (a table with no "only the baseline right" row moves only its "only the candidate right"
  cell), and a table with no discordant row does not move at all; Newcombe's interval is then evaluated on
  that table, real-valued cells and all. No normal approximation of the interval is involved, so empty
  cells cost nothing: (54, 0, 0, 10) at margin 0.02 needs 162, where 1/√n scaling of the observed interval
  said 385.
- continuous: the difference at d - z_β·s/√N against the widest of Student's t and the range floor at N
  (the bootstrap's interval is about t's at that size), from MIN_CONTINUOUS_ROWS up.

Checked against an exact search (the multinomial's every table at N, summed: tests/gates/test_paired_power.py)
on a grid of tables: within 10 % of the smallest N whose exact power reaches 80 %.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from gates.paired_intervals import Table, newcombe, range_floor, t_half_width, z_of

POWER = 0.80
MIN_CONTINUOUS_ROWS = 30   # fewer rows never decide a continuous metric (docs/paired-eval.md)
_LARGEST = 10_000_000      # beyond this no eval set is practical: "no size decides"


def binary_needed_n(table: Table, margin: float, confidence: float, non_inferior_side: bool) -> int | None:
    """Samples at which Newcombe's interval decides with POWER, on the observed cell proportions.
    `non_inferior_side`: the estimate lies above -margin, so the interval's low end must clear it (else its
    high end must fall below it). Every argument is in the candidate-better orientation."""
    n = table.n
    shares = np.array([table.both, table.only_candidate, table.only_baseline, table.neither]) / n
    z, z_power = z_of(confidence), float(stats.norm.ppf(POWER))
    sign = -1.0 if non_inferior_side else 1.0

    def decides(size: int) -> bool:
        low, high = newcombe(_expected_table(shares, size, sign * z_power), z)
        return low > -margin if non_inferior_side else high < -margin

    return _smallest(decides, int(n) + 1)


def _expected_table(shares: np.ndarray, size: int, shift_sd: float) -> Table:
    """The expected table at `size` given that its b - c lies `shift_sd` standard deviations from its mean."""
    pa, pb, pc, pd = (float(s) for s in shares)
    theta = pb - pc
    variance = pb + pc - theta * theta   # of one row's b - c indicator
    cells = shares * size
    if variance > 0:
        shift = shift_sd * math.sqrt(size * variance)
        # Cov(cell, b - c) / Var(b - c) per cell, from the multinomial's covariances; they sum to zero.
        slopes = np.array([-pa * theta, pb * (1 - pb + pc), -pc * (1 - pc + pb), -pd * theta]) / variance
        cells = np.maximum(cells + slopes * shift, 0.0)
    return Table(*(float(c) for c in cells))


def continuous_needed_n(mean: float, spread: float, n: int, margin: float, width: float | None,
                        confidence: float) -> int | None:
    """Samples at which the continuous rule decides with POWER, for differences of this mean and standard
    deviation; `width`: the metric's range (None: unbounded, no range floor)."""
    z, z_power = z_of(confidence), float(stats.norm.ppf(POWER))
    gap = mean + margin   # > 0: show non-inferiority; < 0: show inferiority
    if gap == 0:
        return None

    def decides(size: int) -> bool:
        half = max(t_half_width(spread, size, confidence), range_floor(width, size, z))
        return abs(gap) - z_power * spread / math.sqrt(size) - half > 0

    return _smallest(decides, max(n + 1, MIN_CONTINUOUS_ROWS))


def _smallest(decides: Callable[[int], bool], start: int) -> int | None:
    """The smallest size from `start` that decides (the rule narrows with size), or None below _LARGEST."""
    low, high = start - 1, start
    while not decides(high):
        low, high = high, high * 2
        if high > _LARGEST:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        if decides(middle):
            high = middle
        else:
            low = middle
    return high
