"""Threshold checks with mlflow.models.MetricThreshold semantics, extended to allow a tolerance.

For a metric where greater is better (lower is better mirrors every comparison):
    threshold              value >= threshold
    min_absolute_change    value >= production + min_absolute_change
    min_relative_change    (value - production) / |production| >= min_relative_change
MLflow only accepts positive changes (a required improvement); relctl also accepts 0 (no regression)
and negative values (a tolerated regression), which is what a release gate usually wants.
With no production value the two change checks are skipped and reported as skipped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gates.base import ThresholdCheck

ChangeKind = Literal["min_absolute_change", "min_relative_change"]
# MLflow's fallback when the baseline is 0 and a relative change is undefined.
ZERO_BASELINE_EPSILON = 1e-10


class MetricThreshold(BaseModel):
    """One metric's bounds in release.yaml (`gates.eval.thresholds.<metric>`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float | None = Field(default=None, description="absolute bound on the candidate's value")
    min_absolute_change: float | None = Field(
        default=None, description="vs production: 0 = no regression, -0.02 = may lose 0.02, 0.01 = must gain 0.01"
    )
    min_relative_change: float | None = Field(
        default=None, ge=-1, le=1, description="vs production, as a share of |production|; same signs as above"
    )
    greater_is_better: bool | None = Field(default=None, description="default: the metric's own direction")


def check_metric(
    metric: str,
    value: float,
    bounds: MetricThreshold,
    production: float | None,
    greater_is_better: bool,
) -> tuple[list[ThresholdCheck], list[str]]:
    """All configured checks for one metric, and a note for each change check skipped for lack of production."""
    better = bounds.greater_is_better if bounds.greater_is_better is not None else greater_is_better
    checks: list[ThresholdCheck] = []
    skipped: list[str] = []
    if bounds.threshold is not None:
        checks.append(_compare(metric, value, bounds.threshold, better, "absolute", production))
    changes: tuple[tuple[ChangeKind, float | None], ...] = (
        ("min_absolute_change", bounds.min_absolute_change),
        ("min_relative_change", bounds.min_relative_change),
    )
    for kind, change in changes:
        if change is None:
            continue
        if production is None:
            skipped.append(f"{metric}: {kind} skipped (no production version to compare with)")
            continue
        bound = _change_bound(kind, change, production, better)
        checks.append(_compare(metric, value, bound, better, kind, production))
    return checks, skipped


def _change_bound(kind: ChangeKind, change: float, production: float, better: bool) -> float:
    """The value the candidate must reach, so reports can print one number per check."""
    sign = 1.0 if better else -1.0
    if kind == "min_absolute_change":
        return production + sign * change
    if production == 0:
        return production + sign * ZERO_BASELINE_EPSILON
    return production + sign * change * abs(production)


def _compare(
    metric: str,
    value: float,
    bound: float,
    better: bool,
    kind: Literal["absolute", "min_absolute_change", "min_relative_change"],
    production: float | None,
) -> ThresholdCheck:
    op: Literal[">=", "<="] = ">=" if better else "<="
    passed = value >= bound if better else value <= bound
    return ThresholdCheck(metric=metric, value=value, op=op, bound=bound, passed=passed, kind=kind,
                          production=production)
