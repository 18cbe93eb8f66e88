"""Margins on harness task metrics: named as their SampleScores are, checked at config time against the
configured harnesses, compared candidate vs production by the harness's sample ids."""

from __future__ import annotations

import pytest

from gates.eval_paired import harness_comparisons, margin_problems
from gates.metrics import resolve_metrics
from gates.samples import SampleScores
from release.core.errors import InputError


def scores(metric: str, values: list[float]) -> SampleScores:
    return SampleScores(metric, "binary", True, tuple(str(i) for i in range(len(values))), tuple(values))


def test_a_harness_margin_needs_a_task_of_that_harness() -> None:
    metrics = ["exact_match"]
    margins = {"lm_eval/arc_local/acc": 0.02, "inspect/qa/accuracy": 0.02}
    problems = margin_problems(margins, metrics, resolve_metrics(metrics), frozenset({"lm-eval"}))
    assert [p.message.split(":")[1].strip() for p in problems] == ["gates.eval.margins.inspect/qa/accuracy"]
    assert "no inspect task" in problems[0].message
    assert margin_problems(margins, metrics, resolve_metrics(metrics), frozenset({"lm-eval", "inspect"})) == []


def test_a_harness_margin_compares_candidate_with_production_by_sample_id() -> None:
    production = [scores("lm_eval/arc_local/acc,none", [1.0] * 200)]
    same = [scores("lm_eval/arc_local/acc,none", [1.0] * 200)]
    worse = [scores("lm_eval/arc_local/acc,none", [0.0] * 40 + [1.0] * 160)]
    # The margin may leave out lm-eval's filter suffix.
    (kept,), notes = harness_comparisons({"lm_eval/arc_local/acc": 0.05}, same, production, "production v1", 0.95)
    assert kept.result.outcome == "non_inferior" and kept.result.n == 200 and notes == []
    (lost,), _ = harness_comparisons({"lm_eval/arc_local/acc": 0.05}, worse, production, "production v1", 0.95)
    assert lost.result.outcome == "inferior" and lost.against == "production v1"
    assert lost.result.difference == pytest.approx(-0.2)


def test_a_harness_margin_naming_no_produced_metric_is_an_error_listing_them() -> None:
    candidate = [scores("lm_eval/arc_local/acc,none", [1.0, 0.0])]
    with pytest.raises(InputError) as caught:
        harness_comparisons({"lm_eval/arc_local/f1": 0.02}, candidate, None, "production", 0.95)
    assert "lm_eval/arc_local/acc,none" in (caught.value.hint or "")


def test_without_production_the_harness_margins_are_noted_not_passed() -> None:
    candidate = [scores("lm_eval/arc_local/acc,none", [1.0, 0.0])]
    found, notes = harness_comparisons({"lm_eval/arc_local/acc": 0.02}, candidate, None, "production", 0.95)
    assert found == [] and "not compared" in notes[0]
