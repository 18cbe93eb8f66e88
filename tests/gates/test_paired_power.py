"""`needs about N samples`: within 10 % of the smallest N at which the decision rule's exact power reaches
80 %, on a grid of paired tables (empty cells and the inferior side included), and a continuous metric's N
against Student's t's exact power (the noncentral t).

The exact search here is the test's own: its own vectorised Newcombe interval (checked against compare()'s
on the grid's tables), every 2x2 table at N whose cells lie within 1e-10 of their binomial tails, weighted
by its multinomial probability under the observed cell shares, summed where the rule decides."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import gammaln

from gates.paired import POWER, compare
from gates.paired_figures import table_scores
from gates.samples import SampleScores

Z = float(stats.norm.ppf(0.975))

# (both right, only the candidate right, only the baseline right, neither), margin: underpowered at 64 rows
# (and one at 40, one at 100), with empty cells, ties, and three whose estimate lies below -margin.
GRID = [
    ((54, 0, 0, 10), 0.02), ((32, 0, 0, 32), 0.02), ((61, 0, 0, 3), 0.05), ((31, 1, 0, 32), 0.02),
    ((53, 1, 0, 10), 0.02), ((30, 2, 0, 32), 0.02), ((58, 3, 0, 3), 0.02), ((54, 0, 1, 9), 0.05),
    ((61, 0, 1, 2), 0.05), ((31, 1, 1, 31), 0.05), ((60, 1, 1, 2), 0.05), ((52, 2, 1, 9), 0.02),
    ((59, 2, 1, 2), 0.05), ((29, 3, 1, 31), 0.02), ((30, 2, 2, 30), 0.05), ((50, 4, 2, 8), 0.05),
    ((55, 6, 2, 1), 0.02), ((61, 0, 2, 1), 0.1), ((32, 0, 3, 29), 0.1), ((49, 5, 5, 5), 0.1),
    ((32, 0, 3, 29), 0.02), ((32, 0, 5, 27), 0.02), ((54, 0, 5, 5), 0.02),
    ((33, 0, 0, 7), 0.05), ((80, 3, 2, 15), 0.02),
]


def _wilson(x: np.ndarray, n: float) -> tuple[np.ndarray, np.ndarray]:
    p = x / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * np.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return centre - half, centre + half


def _newcombe(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe (1998) method 10, on arrays of tables, written from the paper."""
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = _wilson(a + b, n)
    l2, u2 = _wilson(a + c, n)
    product = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = np.where(cross > n / 2, cross - n / 2, np.where(cross >= 0, 0.0, cross))
    phi = np.where(product > 0, corrected / np.sqrt(np.where(product > 0, product, 1.0)), 0.0)
    delta = np.sqrt(np.maximum(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    epsilon = np.sqrt(np.maximum(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return np.maximum(-1.0, p1 - p2 - delta), np.minimum(1.0, p1 - p2 + epsilon)


def _counts(size: int, share: float) -> np.ndarray:
    if share <= 0:
        return np.array([0])
    return np.arange(int(stats.binom.ppf(1e-10, size, share)), int(stats.binom.isf(1e-10, size, share)) + 1)


def exact_power(shares: np.ndarray, size: int, margin: float, non_inferior: bool) -> float:
    """P(the rule decides at `size`) when rows are drawn with these cell shares."""
    logs = np.log(np.where(shares > 0, shares, 1.0))
    a = _counts(size, shares[0])[:, None].astype(float)
    c = _counts(size, shares[2])[None, :].astype(float)
    total = 0.0
    for b in _counts(size, shares[1]).astype(float):
        d = size - a - b - c
        possible = (d >= 0) & ((d == 0) | (shares[3] > 0))
        d = np.where(possible, d, 0.0)
        log_p = (gammaln(size + 1) - gammaln(a + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(d + 1)
                 + a * logs[0] + b * logs[1] + c * logs[2] + d * logs[3])
        low, high = _newcombe(a + 0 * c, np.full(log_p.shape, b), c + 0 * a, d)
        decided = low > -margin if non_inferior else high < -margin
        total += float(np.sum(np.exp(np.where(possible & decided, log_p, -np.inf))))
    return total


def exact_smallest_n(shares: np.ndarray, start: int, margin: float, non_inferior: bool) -> int:
    """The smallest N whose exact power reaches POWER: doubling from `start`, then bisection."""
    low, high = start, start
    while exact_power(shares, high, margin, non_inferior) < POWER:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if exact_power(shares, middle, margin, non_inferior) >= POWER:
            high = middle
        else:
            low = middle
    return high


def test_the_exact_search_uses_the_rule_compare_decides_with() -> None:
    for (a, b, c, d), _ in GRID:
        low, high = _newcombe(*(np.array([float(v)]) for v in (a, b, c, d)))
        assert compare(*table_scores(a, b, c, d), margin=0.0).interval == pytest.approx((low[0], high[0]), abs=1e-12)


@pytest.mark.parametrize(("cells", "margin"), GRID, ids=[f"{t}@{m}" for t, m in GRID])
def test_needed_n_is_within_ten_percent_of_the_exact_80_percent_power_size(
        cells: tuple[int, int, int, int], margin: float) -> None:
    result = compare(*table_scores(*cells), margin=margin)
    assert result.outcome == "underpowered" and result.needed_n is not None
    assert f"needs about {result.needed_n} samples for 80% power" in result.describe()
    shares = np.array(cells, dtype=float) / sum(cells)
    exact = exact_smallest_n(shares, result.n, margin, non_inferior=result.difference > -margin)
    assert abs(result.needed_n - exact) <= 0.10 * exact, (result.needed_n, exact)


def test_an_empty_discordant_table_needs_what_decides_not_a_scaled_interval() -> None:
    """(54, 0, 0, 10) at 0.02: scaling the observed interval as 1/sqrt(n) said 385; the rule decides near 170."""
    result = compare(*table_scores(54, 0, 0, 10), margin=0.02)
    assert result.needed_n is not None and result.needed_n < 190


@pytest.mark.parametrize(("mean", "spread", "margin"), [(0.0, 0.08, 0.02), (-0.01, 0.08, 0.03),
                                                         (0.002, 0.03, 0.004), (-0.05, 0.1, 0.03)])
def test_a_continuous_needed_n_matches_student_t_exact_power(mean: float, spread: float, margin: float) -> None:
    """Normal differences, no known range: at N, the t interval's low end clears -margin with the
    noncentral t's probability; the first N where that reaches 80 % is within 10 % of needed_n."""
    rows = 40
    rng = np.random.default_rng(5)
    raw = rng.normal(size=rows)
    differences = mean + spread * (raw - raw.mean()) / raw.std(ddof=1)   # exactly this mean and spread
    ids = tuple(str(i) for i in range(rows))
    base = SampleScores("nll", "continuous", True, ids, tuple(np.full(rows, 5.0)))
    cand = SampleScores("nll", "continuous", True, ids, tuple(5.0 + differences))
    result = compare(cand, base, margin=margin)
    assert result.outcome == "underpowered" and result.needed_n is not None
    gap = mean + margin

    def power(size: int) -> float:
        critical = stats.t.ppf(0.975, size - 1)
        shift = abs(gap) * math.sqrt(size) / spread
        return float(stats.nct.sf(critical, size - 1, shift))

    exact = next(size for size in range(rows, 100_000) if power(size) >= POWER)
    assert abs(result.needed_n - exact) <= 0.10 * exact, (result.needed_n, exact)
