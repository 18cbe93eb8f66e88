"""The paired eval `precision: auto` runs on each variant that passed validation: the eval gate's own rows,
scored per sample (its row scoring), on the shared fp32 reference once and then on each variant, compared
sample by sample with the paired non-inferiority test (gates/paired.py) at the margins of
`gates.eval.margins`.

The release pipeline never imports gates/: it reaches this through the eval gate it loaded from its entry
point (`EvalGate.paired_judge`), so the search stays engine- and gate-agnostic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gates.eval_data import EvalRow
from gates.metrics import Metric, ScoredRow, resolve_metrics, sample_bounds
from gates.packaged import load_package_model
from gates.paired import PairedResult, compare
from gates.samples import SampleKind, SampleScores
from release.backends.base import LoadedModel
from release.core.errors import InputError

Scorer = Callable[[LoadedModel, tuple[EvalRow, ...]], list[ScoredRow]]


@dataclass(frozen=True)
class PerSample:
    """How a metric reads one row (its `sample_kind` and `score_sample`, gates/metrics.py): kind, direction,
    per-row value."""

    kind: SampleKind
    greater_is_better: bool
    value: Callable[[ScoredRow], float]


def per_sample(metric: Metric) -> PerSample:
    score, kind = getattr(metric, "score_sample", None), getattr(metric, "sample_kind", None)
    if callable(score) and kind in ("binary", "continuous"):
        return PerSample(kind, metric.greater_is_better, score)
    raise InputError(f"gates.eval.margins: metric '{metric.name}' has no per-sample score, so it cannot be "
                     "compared sample by sample", hint="set margins on exact_match, token_accuracy or perplexity")


def sample_scores(metric: Metric, rows: tuple[EvalRow, ...], scored: Sequence[ScoredRow]) -> SampleScores:
    """One metric per sample, each sample named by its eval-set line (stable across models)."""
    how = per_sample(metric)
    return SampleScores(metric=metric.name, kind=how.kind, greater_is_better=how.greater_is_better,
                        ids=tuple(str(r.line) for r in rows), values=tuple(how.value(s) for s in scored),
                        bounds=sample_bounds(metric))


class PairedJudge:
    """Scores the reference once; `judge(package_dir)` scores a variant and tests it metric by metric.

    `reference` gives the reference's scored rows and whether they were reused (the release's reference cache:
    scored once per release, shared with the eval gate)."""

    def __init__(self, rows: tuple[EvalRow, ...], margins: dict[str, float], score: Scorer,
                 reference: Callable[[], tuple[list[ScoredRow], bool]], confidence: float = 0.95,
                 seed: int = 0) -> None:
        self.rows, self.margins, self.score, self.seed = rows, dict(margins), score, seed
        self.confidence = confidence
        self.metrics = {m.name: m for m in resolve_metrics(list(margins), "gates.eval.margins")}
        self._reference_rows = reference
        self._reference: dict[str, SampleScores] | None = None
        self.reference_reused: bool | None = None   # None until scored; True when the cache had it
        self.seconds: dict[str, float] = {}

    def _by_metric(self, scored: Sequence[ScoredRow]) -> dict[str, SampleScores]:
        return {name: sample_scores(metric, self.rows, scored) for name, metric in self.metrics.items()}

    def _scores(self, model: LoadedModel) -> dict[str, SampleScores]:
        return self._by_metric(self.score(model, self.rows))

    def reference_scores(self) -> dict[str, SampleScores]:
        if self._reference is None:
            started = time.perf_counter()
            scored, self.reference_reused = self._reference_rows()
            self._reference = self._by_metric(scored)
            self.seconds["reference"] = time.perf_counter() - started
        return self._reference

    def judge(self, label: str, package_dir: Path) -> dict[str, Any]:
        """The variant's verdict: `outcome` (non_inferior only when every metric is), one result per metric,
        and one line saying why."""
        reference = self.reference_scores()
        started = time.perf_counter()
        candidate = self._scores(load_package_model(package_dir))
        results = [compare(candidate[m], reference[m], margin, confidence=self.confidence, seed=self.seed)
                   for m, margin in self.margins.items()]
        self.seconds[label] = time.perf_counter() - started
        return verdict(results)


def verdict(results: list[PairedResult]) -> dict[str, Any]:
    outcomes = {r.outcome for r in results}
    outcome = "inferior" if "inferior" in outcomes else "underpowered" if "underpowered" in outcomes \
        else "non_inferior"
    deciding = [r for r in results if r.outcome == outcome] or results
    return {"outcome": outcome, "reason": "; ".join(r.describe() for r in deciding),
            "metrics": {r.metric: {"n": r.n, "difference": r.difference, "interval": list(r.interval),
                                   "margin": r.margin, "outcome": r.outcome, "needed_n": r.needed_n,
                                   "test": r.test, "p_value": r.p_value,
                                   "candidate_mean": r.candidate_mean, "reference_mean": r.baseline_mean}
                        for r in results}}

