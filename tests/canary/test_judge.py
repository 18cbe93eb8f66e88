"""The judge against scipy on fixed samples: U and p-values, the interval as the inverted U test, ties,
proportions, too little data (inconclusive, never a pass) and the step rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from release.canary.judge import (
    MetricRule,
    Proportion,
    judge_continuous,
    judge_proportion,
    judge_step,
    newcombe_interval,
    shift_interval,
)

PROD = [10.2, 11.1, 9.8, 10.5, 12.0, 10.9, 11.4, 9.6, 10.1, 10.8, 11.9, 10.4]
CAND_SLOW = [13.1, 14.0, 12.6, 13.8, 15.2, 13.3, 12.9, 14.4, 13.6, 14.9]
LATENCY = MetricRule(allowed_relative=0.1, min_samples=8)


def test_statistic_and_p_value_are_scipys() -> None:
    result = judge_continuous("ttft_ms", LATENCY, PROD, CAND_SLOW, 0.98)
    ref = stats.mannwhitneyu(CAND_SLOW, PROD, alternative="two-sided")
    assert result.statistic == pytest.approx(ref.statistic)
    assert result.p_value == pytest.approx(ref.pvalue)
    assert result.verdict == "fail"
    assert result.production == pytest.approx(float(np.median(PROD)))
    assert result.bound == pytest.approx(0.1 * float(np.median(PROD)))


def test_interval_is_the_inverted_exact_u_test() -> None:
    # Without ties the interval is exactly the set of shifts the exact two-sided test does not reject.
    estimate, (lo, hi) = shift_interval(PROD, CAND_SLOW, 0.98)
    assert estimate == pytest.approx(float(np.median(np.subtract.outer(CAND_SLOW, PROD))))
    assert lo < estimate < hi

    def p_at(delta: float) -> float:
        return float(stats.mannwhitneyu(np.asarray(CAND_SLOW) - delta, PROD, method="exact").pvalue)

    eps = 1e-9
    assert p_at(lo + eps) >= 0.02 and p_at(hi - eps) >= 0.02
    assert p_at(lo - eps) < 0.02 and p_at(hi + eps) < 0.02


def test_interval_with_ties_inverts_the_asymptotic_test() -> None:
    rng = np.random.default_rng(3)
    prod = np.round(rng.normal(20, 2, 80))       # whole milliseconds: many ties
    cand = np.round(rng.normal(21, 2, 60))
    _, (lo, hi) = shift_interval(prod, cand, 0.98)
    ref = stats.mannwhitneyu(cand, prod, alternative="two-sided")
    result = judge_continuous("e2el_ms", MetricRule(allowed_absolute=5.0), list(prod), list(cand), 0.98)
    assert result.p_value == pytest.approx(ref.pvalue) and result.verdict == "pass"

    def p_at(delta: float) -> float:
        return float(stats.mannwhitneyu(cand - delta, prod, method="asymptotic", use_continuity=True).pvalue)

    # Shifts well inside are not rejected, shifts a whole step outside are.
    assert p_at((lo + hi) / 2) > 0.5
    assert p_at(lo - 1.0) < 0.02 and p_at(hi + 1.0) < 0.02


def test_identical_samples_pass_and_a_decrease_is_not_a_regression() -> None:
    same = judge_continuous("tpot_ms", LATENCY, PROD, PROD[:10], 0.98)
    faster = judge_continuous("tpot_ms", LATENCY, CAND_SLOW, PROD, 0.98)
    assert same.verdict == "pass" and faster.verdict == "pass"
    quality = MetricRule(bad="decrease", allowed_relative=0.1, min_samples=8)
    assert judge_continuous("score", quality, CAND_SLOW, PROD, 0.98).verdict == "fail"


def test_too_little_data_is_inconclusive_never_pass() -> None:
    result = judge_continuous("ttft_ms", MetricRule(min_samples=10), PROD, PROD[:4], 0.98)
    assert result.verdict == "inconclusive" and result.p_value is None
    step = judge_step({"ttft_ms": MetricRule(min_samples=10)}, {"ttft_ms": (PROD, PROD[:4])})
    assert step.verdict == "inconclusive" and step.score == 0.0
    # Enough rows for min_samples but too few for any 98% interval: still inconclusive.
    tiny = judge_continuous("ttft_ms", MetricRule(min_samples=1), [1.0, 2.0], [3.0], 0.98)
    assert tiny.verdict == "inconclusive"


def test_proportions_fisher_and_newcombe() -> None:
    rule = MetricRule(kind="proportion", allowed_absolute=0.01, critical=True, min_samples=20)
    prod, cand = Proportion(1, 200), Proportion(9, 40)
    result = judge_proportion("error_rate", rule, prod, cand, 0.98)
    ref = stats.fisher_exact([[9, 31], [1, 199]], alternative="greater")
    assert result.p_value == pytest.approx(ref.pvalue) and result.verdict == "fail"
    lo, hi = newcombe_interval(cand, prod, 0.98)
    assert result.interval == (lo, hi) and lo > 0.01
    # Newcombe's worked example (Stat Med 1998, table II, 95%): 56/70 vs 48/80 -> [0.0524, 0.3339].
    lo95, hi95 = newcombe_interval(Proportion(56, 70), Proportion(48, 80), 0.95)
    assert (round(lo95, 4), round(hi95, 4)) == (0.0524, 0.3339)
    one_error = judge_proportion("error_rate", rule, Proportion(0, 200), Proportion(1, 30), 0.98)
    assert one_error.verdict == "pass"
    assert judge_proportion("error_rate", rule, prod, Proportion(0, 5), 0.98).verdict == "inconclusive"


def test_step_rule_critical_and_score() -> None:
    rules = {"ttft_ms": LATENCY, "e2el_ms": LATENCY,
             "error_rate": MetricRule(kind="proportion", allowed_absolute=0.01, critical=True, min_samples=10)}
    ok_errors = (Proportion(0, 100), Proportion(0, 20))
    one_slow = judge_step(rules, {"ttft_ms": (PROD, CAND_SLOW), "e2el_ms": (PROD, PROD), "error_rate": ok_errors},
                          pass_score=0.6)
    assert one_slow.verdict == "pass" and one_slow.score == pytest.approx(2 / 3)
    strict = judge_step(rules, {"ttft_ms": (PROD, CAND_SLOW), "e2el_ms": (PROD, PROD), "error_rate": ok_errors},
                        pass_score=0.75)
    assert strict.verdict == "fail" and "ttft_ms" in strict.reason
    errors = judge_step(rules, {"ttft_ms": (PROD, PROD), "e2el_ms": (PROD, PROD),
                                "error_rate": (Proportion(0, 100), Proportion(10, 20))}, pass_score=0.5)
    assert errors.verdict == "fail" and errors.reason.startswith("critical metric failed: error_rate")
    unknown_critical = judge_step(rules, {"ttft_ms": (PROD, PROD), "e2el_ms": (PROD, PROD),
                                          "error_rate": (Proportion(0, 100), Proportion(0, 3))}, pass_score=0.5)
    assert unknown_critical.verdict == "inconclusive"
    assert all(math.isfinite(m.p_value or 0.0) for m in strict.metrics)
    assert strict.to_json()["metrics"][0]["interval"] is not None
