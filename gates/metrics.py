"""Eval metrics as small plug-ins: each turns the scored rows of an eval set into one number.

Built-ins register through the `relctl.metrics` entry-point group, like a third-party metric would:

    [project.entry-points."relctl.metrics"]
    bleu = "mypkg.metrics:Bleu"

A metric class has a `name`, `greater_is_better` (the default direction of its thresholds),
`needs_logits` (whether rows must carry teacher-forced target scores) and `compute(rows)`. A metric that
can be compared sample by sample (`gates.eval.margins`, gates/paired.py) also has `sample_kind` ("binary"
or "continuous") and `score_sample(row)`: its value on one eval row, the paired unit (rows are the
independent draws; a row's tokens are not). A continuous one whose per-row values lie in a known range
declares it as `sample_bounds = (low, high)`: the interval is then never narrower than the range allows at
that many rows (gates/paired_intervals.py); without it the metric is taken as unbounded.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from gates.samples import SampleKind
from release.core.errors import ConfigError
from release.core.plugins import PluginGroup, load_group

ENTRY_POINT_GROUP = "relctl.metrics"
T = TypeVar("T")


@dataclass(frozen=True)
class ScoredRow:
    """One eval row after the model ran on it.

    `output` is the greedy generation (stripped); `target_logprobs` and `target_hits` are per token of
    `expected` under teacher forcing (log-probability, and whether it was the argmax), or None when
    no requested metric needs logits.
    """

    prompt: str
    expected: str
    output: str
    target_logprobs: tuple[float, ...] | None = None
    target_hits: tuple[bool, ...] | None = None


class Metric(Protocol):
    name: ClassVar[str]
    greater_is_better: ClassVar[bool]
    needs_logits: ClassVar[bool]

    def compute(self, rows: Sequence[ScoredRow]) -> float:
        """The metric over all rows (rows is never empty: the eval set is validated first)."""
        ...


class ExactMatch:
    """Share of rows whose generated answer equals `expected` after stripping whitespace."""

    name: ClassVar[str] = "exact_match"
    greater_is_better: ClassVar[bool] = True
    needs_logits: ClassVar[bool] = False

    def compute(self, rows: Sequence[ScoredRow]) -> float:
        return sum(r.output.strip() == r.expected.strip() for r in rows) / len(rows)

    sample_kind: ClassVar[SampleKind] = "binary"

    def score_sample(self, row: ScoredRow) -> float:
        """1 when this row's answer is exactly right, else 0."""
        return float(row.output.strip() == row.expected.strip())


class TokenAccuracy:
    """Teacher-forced next-token accuracy over the tokens of `expected`, pooled over all rows."""

    name: ClassVar[str] = "token_accuracy"
    greater_is_better: ClassVar[bool] = True
    needs_logits: ClassVar[bool] = True

    def compute(self, rows: Sequence[ScoredRow]) -> float:
        hits = [h for r in rows for h in _require(r.target_hits, self.name)]
        return sum(hits) / len(hits) if hits else 0.0

    sample_kind: ClassVar[SampleKind] = "continuous"
    sample_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def score_sample(self, row: ScoredRow) -> float:
        """This row's share of target tokens predicted (every row weighs the same, unlike the pooled value)."""
        hits = _require(row.target_hits, self.name)
        return sum(hits) / len(hits) if hits else 0.0


class Perplexity:
    """exp(mean negative log-likelihood) of the `expected` tokens given the prompt, token-weighted."""

    name: ClassVar[str] = "perplexity"
    greater_is_better: ClassVar[bool] = False
    needs_logits: ClassVar[bool] = True

    def compute(self, rows: Sequence[ScoredRow]) -> float:
        logprobs = [lp for r in rows for lp in _require(r.target_logprobs, self.name)]
        if not logprobs:
            return math.inf
        return math.exp(-sum(logprobs) / len(logprobs))

    sample_kind: ClassVar[SampleKind] = "continuous"

    def score_sample(self, row: ScoredRow) -> float:
        """This row's mean negative log-likelihood per target token (nats): the log of its perplexity, so a
        margin m on it tolerates a perplexity about exp(m) times production's (0.01: about 1 %)."""
        logprobs = _require(row.target_logprobs, self.name)
        return -sum(logprobs) / len(logprobs) if logprobs else math.inf


def per_sample(metric: Metric) -> SampleKind | None:
    """The metric's per-sample kind, or None when it has no per-sample form (it cannot take a margin)."""
    kind = getattr(metric, "sample_kind", None)
    return kind if kind in ("binary", "continuous") and callable(getattr(metric, "score_sample", None)) else None


def sample_bounds(metric: Metric) -> tuple[float, float] | None:
    """The range a metric's per-sample values lie in (`sample_bounds`), or None: unbounded, or binary."""
    bounds = getattr(metric, "sample_bounds", None)
    if per_sample(metric) != "continuous" or bounds is None:
        return None
    low, high = bounds
    return float(low), float(high)


def _require(values: tuple[T, ...] | None, metric: str) -> tuple[T, ...]:
    if values is None:
        raise ValueError(f"{metric} needs teacher-forced scores, but the rows carry none")
    return values


def _group() -> PluginGroup:
    # The one plug-in loader (release/core/plugins.py): isolated import, `name` equal to the entry-point name.
    return load_group(ENTRY_POINT_GROUP, "metric", id_attr="name")


def available_metrics() -> dict[str, type[Metric]]:
    """Every installed metric that loads, by name (built-ins included), from the `relctl.metrics` entry points."""
    return dict(_group().loaded)


def resolve_metrics(names: Sequence[str], where: str = "gates.eval.metrics") -> list[Metric]:
    """Instances of the named metrics, in order; an unknown name, or one whose plug-in does not load, is a
    ConfigError with a hint."""
    group = _group()
    known: dict[str, type[Metric]] = dict(group.loaded)
    metrics: list[Metric] = []
    for name in names:
        group.get(name, f"{where}: metric '{name}'")   # a broken plug-in: its reason, exit 2
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known metrics: {', '.join(sorted(known))}"
            raise ConfigError(f"{where}: unknown metric '{name}'", hint=hint)
        metrics.append(known[name]())
    return metrics
