"""The paired comparison: exact McNemar, Newcombe's interval, the bootstrap, orientation and the decision."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gates.paired import compare
from gates.samples import SampleScores


def _table(both: int, only_candidate: int, only_baseline: int, neither: int,
           metric: str = "exact_match") -> tuple[SampleScores, SampleScores]:
    """Binary scores laid out as a paired 2x2 table (candidate right / baseline right)."""
    cand = [1.0] * both + [1.0] * only_candidate + [0.0] * only_baseline + [0.0] * neither
    base = [1.0] * both + [0.0] * only_candidate + [1.0] * only_baseline + [0.0] * neither
    ids = tuple(f"row-{i}" for i in range(len(cand)))
    return (SampleScores(metric, "binary", True, ids, tuple(cand)),
            SampleScores(metric, "binary", True, ids, tuple(base)))


def _exact_mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar by hand: twice the binomial tail of the rarer discordant count."""
    tail = sum(math.comb(b + c, k) for k in range(min(b, c) + 1)) / 2 ** (b + c)
    return min(1.0, 2 * tail)


def test_mcnemar_p_value_and_newcombe_interval_match_published_values() -> None:
    # Cavo et al. 2012 as worked in Fagerland, Lydersen & Laake (2014): 59/6/16/80,
    # difference -0.0621, Newcombe square-and-add 95% CI -0.1186 to -0.0046, exact McNemar p = 0.052.
    result = compare(*_table(59, 6, 16, 80), margin=0.0)
    assert result.test == "mcnemar-exact"
    assert result.p_value == pytest.approx(_exact_mcnemar(6, 16), rel=1e-12)
    assert result.p_value == pytest.approx(0.0525, abs=5e-4)
    assert result.difference == pytest.approx(-10 / 161)
    assert result.interval == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    assert result.outcome == "inferior"  # the whole interval is below 0 = -margin


def test_small_discordance_is_non_inferior_at_a_margin_and_reads_so() -> None:
    result = compare(*_table(300, 4, 6, 90), margin=0.05)
    assert result.n == 400
    assert result.p_value == pytest.approx(_exact_mcnemar(4, 6), rel=1e-12)
    assert result.interval[0] > -0.05
    assert result.outcome == "non_inferior" and result.passed
    line = result.describe()
    assert "n=400" in line and "-0.0050" in line and "margin 0.05" in line and "non-inferior" in line


def test_a_clear_loss_is_inferior() -> None:
    result = compare(*_table(150, 2, 30, 18), margin=0.05)
    assert result.difference == pytest.approx(-28 / 200)
    assert result.interval[1] < -0.05
    assert result.outcome == "inferior" and not result.passed and result.needed_n is None


def test_too_few_samples_is_underpowered_with_an_estimate_that_decides() -> None:
    cand, base = _table(18, 1, 1, 0)
    result = compare(cand, base, margin=0.05)
    assert result.outcome == "underpowered" and not result.passed
    assert result.needed_n is not None and result.needed_n > result.n
    assert f"needs about {result.needed_n} samples" in result.describe()
    # The same agreement pattern at the estimated size decides: replicate the table up to needed_n.
    copies = math.ceil(result.needed_n / result.n)
    bigger = compare(*_table(18 * copies, copies, copies, 0), margin=0.05)
    assert bigger.outcome == "non_inferior", bigger.describe()


def test_lower_is_better_is_oriented_so_positive_means_candidate_better() -> None:
    rng = np.random.default_rng(3)
    baseline = rng.normal(3.0, 0.5, size=200)
    candidate = baseline - 0.05 + rng.normal(0.0, 0.02, size=200)  # lower NLL: the candidate is better
    ids = tuple(str(i) for i in range(200))
    cand = SampleScores("perplexity", "continuous", False, ids, tuple(candidate))
    base = SampleScores("perplexity", "continuous", False, ids, tuple(baseline))
    result = compare(cand, base, margin=0.01, seed=7)
    assert result.test == "paired-bootstrap" and result.p_value is None
    assert result.difference == pytest.approx(float(np.mean(baseline - candidate)))
    assert 0 < result.interval[0] < result.difference < result.interval[1]
    assert result.outcome == "non_inferior"
    assert compare(cand, base, margin=0.01, seed=7) == result  # seeded: the same interval every run
    worse = compare(base, cand, margin=0.01, seed=7)  # the other way round it is worse by ~0.05
    assert worse.difference == pytest.approx(-result.difference) and worse.outcome == "inferior"


def _continuous(metric: str, values: list[float], bounds: tuple[float, float] | None = None) -> SampleScores:
    ids = tuple(f"row-{i}" for i in range(len(values)))
    higher = metric != "perplexity"
    if bounds is None:
        return SampleScores(metric, "continuous", higher, ids, tuple(values))
    return SampleScores(metric, "continuous", higher, ids, tuple(values), bounds=bounds)


@pytest.mark.parametrize(("metric", "bounds"), [("token_accuracy", (0.0, 1.0)), ("perplexity", None)])
def test_one_row_is_underpowered_never_a_zero_width_pass(metric: str, bounds: tuple[float, float] | None) -> None:
    one = _continuous(metric, [0.5], bounds)
    result = compare(one, one, margin=0.05)
    assert result.outcome == "underpowered" and not result.passed
    assert "1 row: a continuous metric decides from 30 rows" in result.describe()
    assert result.needed_n is not None and result.needed_n >= 30


@pytest.mark.parametrize(("metric", "bounds"), [("token_accuracy", (0.0, 1.0)), ("perplexity", None)])
def test_three_rows_a_hundredth_apart_are_underpowered(metric: str, bounds: tuple[float, float] | None) -> None:
    base = _continuous(metric, [0.5, 0.5, 0.5], bounds)
    cand = _continuous(metric, [0.49, 0.5, 0.51], bounds)
    result = compare(cand, base, margin=0.05)
    # Student's t alone would say [-0.025, +0.025]: inside the margin; three rows still decide nothing.
    assert result.outcome == "underpowered" and "3 rows" in result.describe()
    assert result.interval[0] <= -0.0248


def test_identical_rows_of_a_bounded_metric_are_no_more_certain_than_a_binary_metric() -> None:
    """64 identical rows of token accuracy (in [0, 1]): up to z^2/(n + z^2) = 5.66 % of rows could still differ
    by the whole range, so the interval is +-0.0566, not [0, 0]: a 0.05 margin needs 73 rows, 0.06 passes."""
    side = _continuous("token_accuracy", [0.25, 0.5, 1.0, 0.75] * 16, (0.0, 1.0))
    result = compare(side, side, margin=0.05)
    assert result.interval == pytest.approx((-3.8415 / 67.8415, 3.8415 / 67.8415), abs=1e-4)
    assert result.outcome == "underpowered" and result.needed_n == 73 and "(range floor)" in result.describe()
    assert compare(side, side, margin=0.06).outcome == "non_inferior"
    bigger = _continuous("token_accuracy", [0.25, 0.5, 1.0, 0.75] * 18 + [0.5], (0.0, 1.0))
    assert compare(bigger, bigger, margin=0.05).outcome == "non_inferior"   # 73 rows decide
    # With no known range (perplexity's per-row NLL), 64 identical rows are real evidence: [0, 0] passes.
    nll = _continuous("perplexity", [0.25, 0.5, 1.0, 0.75] * 16)
    assert compare(nll, nll, margin=0.01).interval == (0.0, 0.0)


def test_a_value_outside_the_metrics_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="1 values lie outside its bounds"):
        _continuous("token_accuracy", [0.5, 1.5], (0.0, 1.0))


def test_samples_on_one_side_only_are_named_with_counts() -> None:
    cand = SampleScores("exact_match", "binary", True, ("1", "2", "3"), (1.0, 0.0, 1.0))
    base = SampleScores("exact_match", "binary", True, ("1", "2", "4", "5"), (1.0, 0.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="1 samples scored only for the candidate and 2 only for the baseline"):
        compare(cand, base, margin=0.02)


@pytest.mark.parametrize("margin", [-0.01, math.nan])
def test_a_negative_or_missing_margin_is_refused(margin: float) -> None:
    with pytest.raises(ValueError, match="margin must be a number >= 0"):
        compare(*_table(5, 0, 0, 5), margin=margin)
