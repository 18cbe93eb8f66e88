"""Per-sample scores: what every eval source (the team's JSONL, an lm-eval task, an Inspect task) hands
to the paired comparison, so candidate and production are compared sample by sample, not by aggregate.

A sample id is stable across models (the row's line, the harness's doc id), so the two sides pair by id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SampleKind = Literal["binary", "continuous"]


@dataclass(frozen=True)
class SampleScores:
    """One metric's value on every sample of one eval source, for one model.

    `metric` is qualified by its source ("exact_match", "lm_eval/arc_local/acc", "inspect/qa/accuracy");
    `kind` chooses the test (binary: exact McNemar; continuous: paired bootstrap); `values` are 0/1 for
    binary metrics. `bounds`: the range a continuous metric's values can take when it has one (token
    accuracy: (0, 1)); it sets the least width of the interval (gates/paired_intervals.py), None: unbounded.
    """

    metric: str
    kind: SampleKind
    greater_is_better: bool
    ids: tuple[str, ...]
    values: tuple[float, ...]
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.values):
            raise ValueError(f"{self.metric}: {len(self.ids)} sample ids but {len(self.values)} values")
        if len(set(self.ids)) != len(self.ids):
            raise ValueError(f"{self.metric}: sample ids repeat, so samples cannot be paired")
        if self.kind == "binary" and any(v not in (0.0, 1.0) for v in self.values):
            raise ValueError(f"{self.metric}: a binary metric's values are 0 or 1")
        if self.bounds is not None:
            low, high = self.bounds
            if not low < high:
                raise ValueError(f"{self.metric}: bounds {self.bounds} are not (low, high) with low < high")
            outside = [v for v in self.values if not low <= v <= high]
            if outside:
                raise ValueError(f"{self.metric}: {len(outside)} values lie outside its bounds [{low:g}, {high:g}] "
                                 f"(e.g. {outside[0]:g})")

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else float("nan")
