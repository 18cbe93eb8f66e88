"""A metric compared with a bound: the one shape validation and every gate report their checks in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ThresholdCheck:
    """One metric compared with one bound; `production` is the current production's value when known."""

    metric: str
    value: float | None
    op: Literal[">=", "<=", ">", "<"]
    bound: float
    passed: bool
    kind: Literal["absolute", "min_absolute_change", "min_relative_change"] = "absolute"
    production: float | None = None
