"""What one harness task run hands back: its per-sample scores (gates.samples.SampleScores, one per metric)
and what the package records about it (harness and version, task names, task file digests, config)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gates.samples import SampleKind, SampleScores


@dataclass(frozen=True)
class TaskRun:
    """One task of one harness, run against one served model."""

    harness: str
    harness_version: str
    task: str                          # the entry's task (lm-eval: the task or group name)
    tasks: list[str]                   # the tasks it ran (a group's subtasks)
    digests: dict[str, str]            # task file and local data file -> sha256
    config: dict[str, Any]             # the harness's own record of the task config, and how it was called
    scores: tuple[SampleScores, ...] = field(default=())
    skipped_metrics: tuple[str, ...] = ()  # metrics with no per-sample score (corpus-level ones)
    # task -> sample id -> the model's raw answer (lm-eval: each choice's log-likelihood), for the evidence
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What the gate's details keep (the scores themselves go to the evidence file)."""
        return {"harness": self.harness, "version": self.harness_version, "task": self.task, "tasks": self.tasks,
                "digests": self.digests, "config": self.config,
                "metrics": {s.metric: {"kind": s.kind, "n": len(s.values), "mean": s.mean} for s in self.scores},
                "skipped_metrics": list(self.skipped_metrics)}


def scores_by_metric(prefix: str, values: Mapping[str, Iterable[tuple[str, Any]]],
                     higher_is_better: Mapping[str, Any],
                     binary: frozenset[str]) -> tuple[list[SampleScores], list[str]]:
    """SampleScores per metric from (sample id, value) pairs; metrics whose values are not all finite numbers
    (corpus-level items such as (reference, prediction) pairs) are left out. `binary`: the metric names
    (before any `,filter` suffix) whose values are 0/1. Returns the scores and the metrics left out."""
    out: list[SampleScores] = []
    skipped: list[str] = []
    for metric, pairs in sorted(values.items()):
        rows = list(pairs)
        if not rows or not all(_number(v) for _, v in rows):
            skipped.append(f"{prefix}/{metric}")
            continue
        base = metric.split(",")[0]
        numbers = [float(v) for _, v in rows]
        kind: SampleKind = "binary" if base in binary and all(v in (0.0, 1.0) for v in numbers) else "continuous"
        better = higher_is_better.get(base, higher_is_better.get(metric, True))
        out.append(SampleScores(metric=f"{prefix}/{metric}", kind=kind, greater_is_better=bool(better),
                                ids=tuple(i for i, _ in rows), values=tuple(numbers)))
    return out, skipped


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value))


# relctl's own per-sample aids (lm-eval's multiple-choice target log-likelihood): shown in tables, not as the
# task's own score in the one-line verdict.
RELCTL_METRICS = frozenset({"target_loglikelihood"})


def task_scores(candidate: Iterable[TaskRun], production: Iterable[TaskRun] | None) -> list[dict[str, Any]]:
    """Each task's per-sample metrics as their means, candidate beside production (None where production was
    not scored): what the gate's line, the card, the report and the job summary show beside the paired
    verdict. Keys: harness, task, metric, name (the qualified metric margins use), kind, greater_is_better, own
    (a metric of the task itself, not relctl's aid), n, candidate, production, production_n."""
    theirs = {s.metric: s for run in production or [] for s in run.scores}
    out: list[dict[str, Any]] = []
    for run in candidate:
        for scores in run.scores:
            task, metric = scores.metric.split("/", 1)[1].rsplit("/", 1)
            other = theirs.get(scores.metric)
            out.append({"harness": run.harness, "task": task, "metric": metric, "name": scores.metric,
                        "kind": scores.kind, "greater_is_better": scores.greater_is_better,
                        "own": metric.split(",")[0] not in RELCTL_METRICS, "n": len(scores.values),
                        "candidate": scores.mean, "production": None if other is None else other.mean,
                        "production_n": None if other is None else len(other.values)})
    return out
