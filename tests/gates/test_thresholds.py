"""Threshold checks agree with MLflow's own MetricThreshold validation where MLflow's domain allows."""

from __future__ import annotations

import itertools

import pytest
from mlflow.models import MetricThreshold as MlflowThreshold
from mlflow.models.evaluation import EvaluationResult
from mlflow.models.evaluation.validation import ModelValidationFailedException, validate_evaluation_results

from gates.thresholds import MetricThreshold, check_metric

VALUES = [0.0, 0.5, 0.79, 0.8, 0.81, 1.0, 2.5]
BASELINES = [0.0, 0.4, 0.8, 2.0, -1.0]


def mlflow_passes(value: float, baseline: float | None, **bounds: object) -> bool:
    threshold = MlflowThreshold(**bounds)  # type: ignore[arg-type]
    candidate = EvaluationResult(metrics={"m": value}, artifacts={})
    base = EvaluationResult(metrics={"m": baseline}, artifacts={}) if baseline is not None else None
    try:
        validate_evaluation_results({"m": threshold}, candidate, base)
    except ModelValidationFailedException:
        return False
    return True


@pytest.mark.parametrize("greater", [True, False])
@pytest.mark.parametrize("bounds", [
    {"threshold": 0.8},
    {"min_absolute_change": 0.01},
    {"min_relative_change": 0.05},
    {"threshold": 0.8, "min_absolute_change": 0.2, "min_relative_change": 0.5},
])
def test_matches_mlflow_validation(greater: bool, bounds: dict[str, float]) -> None:
    ours = MetricThreshold(**bounds, greater_is_better=greater)
    for value, baseline in itertools.product(VALUES, BASELINES):
        checks, skipped = check_metric("m", value, ours, baseline, greater)
        assert not skipped
        assert all(c.passed for c in checks) == mlflow_passes(value, baseline, **bounds, greater_is_better=greater), (
            value, baseline, checks)


def test_zero_change_means_no_regression() -> None:
    bounds = MetricThreshold(min_absolute_change=0.0)
    assert check_metric("em", 0.90, bounds, 0.90, True)[0][0].passed
    worse = check_metric("em", 0.89, bounds, 0.90, True)[0][0]
    assert not worse.passed and worse.bound == 0.90 and worse.kind == "min_absolute_change"


def test_negative_change_tolerates_a_small_regression() -> None:
    bounds = MetricThreshold(min_relative_change=-0.10)
    (lower_is_better,) = check_metric("ppl", 1.09, bounds, 1.0, False)[0]
    assert lower_is_better.passed and lower_is_better.op == "<=" and lower_is_better.bound == pytest.approx(1.10)
    assert not check_metric("ppl", 1.11, bounds, 1.0, False)[0][0].passed


def test_without_production_the_change_checks_are_skipped_and_said_so() -> None:
    bounds = MetricThreshold(threshold=0.5, min_absolute_change=0.0, min_relative_change=0.0)
    checks, skipped = check_metric("em", 0.7, bounds, None, True)
    assert [c.kind for c in checks] == ["absolute"]
    assert len(skipped) == 2 and all("no production version" in note for note in skipped)


def test_config_direction_overrides_the_metric_default() -> None:
    (check,) = check_metric("loss", 0.3, MetricThreshold(threshold=0.5, greater_is_better=False), None, True)[0]
    assert check.op == "<=" and check.passed
