"""Tie-aware top-1 agreement (release/stages/top1.py) on hand-made references: each distinct prefix once,
near-ties left out, both figures reported."""

from __future__ import annotations

import math

import numpy as np

from release.stages.reference import PromptReference, top2_margins
from release.stages.top1 import top1_agreement


def reference(sequence: list[int], top: list[tuple[int, float, float]]) -> PromptReference:
    """A reference whose position i prefers top[i][0], by top[i][1] - top[i][2] nats over the runner-up."""
    top_ids = np.array([[t, (t + 1) % 8] for t, _, _ in top], dtype=np.int32)
    top_logprobs = np.array([[a, b] for _, a, b in top])
    return PromptReference(ids=sequence[:2], continuation=sequence[2:], top_ids=top_ids, top_logprobs=top_logprobs,
                           next_logprobs=np.zeros(len(sequence) - 1), vocab=8)


def test_a_shared_prefix_counts_once_and_a_near_tie_not_at_all() -> None:
    # Two prompts share their first two tokens; at the second the reference's top two are 0.01 nats apart.
    first = reference([0, 5, 1, 2], [(5, -0.1, -3.0), (3, -0.69, -0.70), (2, -0.2, -2.0), (7, -0.1, -4.0)])
    second = reference([0, 5, 4, 6], [(5, -0.1, -3.0), (3, -0.69, -0.70), (6, -0.3, -1.5), (1, -0.1, -4.0)])
    assert np.allclose(top2_margins(first), [2.9, 0.01, 1.8, 3.9])
    # The candidate agrees everywhere but at the near-tie (in both prompts) and at the second's third position.
    candidate = [np.array([5, 4, 2, 7]), np.array([5, 4, 1, 1])]
    found = top1_agreement([first, second], candidate, near_tie_nats=0.05)
    assert found.raw == 5 / 8
    assert (found.counted, found.near_ties, found.repeated) == (5, 1, 2)
    assert found.tie_aware == 4 / 5
    loose = top1_agreement([first, second], candidate, near_tie_nats=0.0)
    assert (loose.counted, loose.tie_aware) == (6, 4 / 6)   # the near-tie once, not twice
    assert found.metrics()["top1_agreement"] == found.tie_aware


def test_nothing_decisive_is_nan_never_a_pass() -> None:
    tied = reference([0, 1, 2], [(1, -0.69, -0.70)] * 3)
    found = top1_agreement([tied], [np.array([1, 2, 3])], near_tie_nats=0.05)
    assert found.counted == 0 and math.isnan(found.tie_aware) and not found.tie_aware >= 0.9


def test_the_card_says_top1_is_tie_aware_beside_the_raw_figure() -> None:
    from release.pipeline.report import ReleaseReport, decision_table

    validation = {"passed": True,
                  "checks": [{"metric": "top1_agreement", "value": 1.0, "op": ">=", "bound": 0.95, "passed": True}],
                  "metrics": {"top1_agreement": 1.0, "top1_agreement_raw": 0.917, "top1_near_ties": 1.0,
                              "top1_repeated_prefixes": 92.0}}
    report = ReleaseReport(model="m", training_run="r", release_run=None, precision="int8", validation=validation)
    row = next(line for line in decision_table(report) if line.startswith("| validation vs fp32"))
    assert "top1_agreement 1 >= 0.95" in row
    assert "top-1 is tie-aware (raw 0.917: 1 near-tie and 92 repeated prefixes not counted)" in row
