"""Metric plug-ins: definitions on known inputs, and the registry's errors."""

from __future__ import annotations

import math

import pytest

from gates.metrics import ScoredRow, available_metrics, resolve_metrics
from release.core.errors import ConfigError


def test_builtins_register_through_entry_points() -> None:
    assert {"exact_match", "token_accuracy", "perplexity"} <= set(available_metrics())


def test_definitions() -> None:
    rows = [
        ScoredRow("p1", "a b", " a b ", (math.log(0.5), math.log(0.25)), (True, False)),
        ScoredRow("p2", "c", "d", (math.log(0.5),), (True,)),
    ]
    em, acc, ppl = resolve_metrics(["exact_match", "token_accuracy", "perplexity"])
    assert em.compute(rows) == 0.5
    assert acc.compute(rows) == pytest.approx(2 / 3)
    # Token-weighted: exp(-(ln .5 + ln .25 + ln .5) / 3) = 2 ** (4 / 3)
    assert ppl.compute(rows) == pytest.approx(2 ** (4 / 3))
    assert (em.greater_is_better, acc.greater_is_better, ppl.greater_is_better) == (True, True, False)


def test_unknown_metric_is_a_config_error_with_a_hint() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_metrics(["exact_match", "exact_mach"])
    assert info.value.message == "gates.eval.metrics: unknown metric 'exact_mach'"
    assert info.value.hint == "did you mean 'exact_match'?"


def test_logit_metrics_refuse_rows_without_scores() -> None:
    (ppl,) = resolve_metrics(["perplexity"])
    with pytest.raises(ValueError, match="teacher-forced"):
        ppl.compute([ScoredRow("p", "e", "e")])
