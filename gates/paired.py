"""Paired non-inferiority: is the candidate no worse than the baseline by more than a margin, sample by sample?

Aggregates hide regressions that a paired comparison sees: two models with the same accuracy can disagree
on many samples, and a model that lost a few answers can still clear an absolute threshold. Pairing by
sample id removes the between-sample variance, so far fewer samples decide the question.

Everything is on the *oriented* difference, candidate - baseline with the sign flipped for metrics where
lower is better, so a positive difference always means "candidate better". With a two-sided interval at
`confidence` (0.95 ⇒ a one-sided test at 2.5 %, the CONSORT convention for non-inferiority):

- interval low  > -margin → ``non_inferior`` (the worst plausible loss is smaller than the margin);
- interval high < -margin → ``inferior``     (even the best plausible case loses more than the margin);
- otherwise               → ``underpowered`` (the data cannot tell; never a pass), with ``needed_n``.

A continuous metric is also ``underpowered`` below MIN_CONTINUOUS_ROWS rows, whatever its interval says.

Binary metrics (0/1 per sample): the exact McNemar test on the discordant pairs (``p_value``; its null is
"no difference", reported as evidence, not used for the decision) and Newcombe's square-and-add (Wilson
score) interval for a difference of paired proportions with the continuity-corrected correlation (Newcombe
1998, Stat. Med. 17:2635; recommended by Fagerland, Lydersen & Laake 2014, SMMR 23:1), which keeps its
coverage with few discordant pairs where a Wald interval does not. Continuous metrics: the widest of a
seeded BCa bootstrap of the mean per-sample difference, Student's t, and on a metric with a known range the
range floor (gates/paired_intervals.py), so identical rows never give a zero-width interval that passes.

``needed_n`` is the sample size at which the rule would decide with 80 % power, assuming the observed
proportions (or mean and spread) are the truth (gates/paired_power.py); None when the difference sits on
-margin, where no sample size decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gates.paired_intervals import Table, continuous, mcnemar_p, newcombe, z_of
from gates.paired_power import MIN_CONTINUOUS_ROWS, POWER, binary_needed_n, continuous_needed_n
from gates.samples import SampleScores

Outcome = Literal["non_inferior", "inferior", "underpowered"]
PairedTest = Literal["mcnemar-exact", "paired-bootstrap"]

__all__ = ["MIN_CONTINUOUS_ROWS", "POWER", "Outcome", "PairedResult", "PairedTest", "compare"]


@dataclass(frozen=True)
class PairedResult:
    """One metric's paired comparison of a candidate with a baseline (see the module docstring)."""

    metric: str
    n: int
    candidate_mean: float
    baseline_mean: float
    difference: float
    interval: tuple[float, float]
    margin: float
    outcome: Outcome
    needed_n: int | None
    test: PairedTest
    p_value: float | None
    confidence: float = 0.95
    greater_is_better: bool = True
    power: float = POWER              # the power needed_n is computed for
    # What set a continuous interval's width ("bootstrap", "t", "range floor"); None for binary metrics.
    widest: str | None = None
    # Why a continuous metric could not decide whatever its interval: too few rows (None otherwise).
    too_few: str | None = None

    @property
    def passed(self) -> bool:
        """Only a shown non-inferiority passes; underpowered is not a pass."""
        return self.outcome == "non_inferior"

    def describe(self) -> str:
        """One line: n, the difference, its interval, the margin and what they decide."""
        low, high = self.interval
        direction = "" if self.greater_is_better else " (lower is better; sign flipped)"
        floor = f" ({self.widest})" if self.widest in ("t", "range floor") else ""
        line = (f"{self.metric}: n={self.n}, difference {self.difference:+.4f}{direction}, "
                f"{self.confidence:.0%} CI [{low:+.4f}, {high:+.4f}]{floor}, margin {self.margin:g}")
        if self.p_value is not None:
            line += f", McNemar exact p={self.p_value:.3g}"
        if self.outcome == "non_inferior":
            return f"{line}: non-inferior"
        if self.outcome == "inferior":
            return f"{line}: inferior (worse by more than the margin)"
        needs = f"needs about {self.needed_n} samples for {self.power:.0%} power" if self.needed_n is not None \
            else "the difference sits on the margin; no sample size decides"
        return f"{line}: underpowered ({self.too_few + '; ' if self.too_few else ''}{needs})"


def compare(candidate: SampleScores, baseline: SampleScores, margin: float, *,
            confidence: float = 0.95, seed: int = 0) -> PairedResult:
    """Compare `candidate` with `baseline` on the samples both scored, at non-inferiority `margin`.

    `margin` is in the metric's own units (0.02 = two points of exact match). Raises ValueError when the
    two sides are not the same metric, do not cover the same samples, or the arguments are out of range.
    """
    _check_arguments(candidate, baseline, margin, confidence)
    cand, base = _pair(candidate, baseline)
    sign = 1.0 if candidate.greater_is_better else -1.0
    n = len(cand)
    difference = sign * float(np.mean(cand - base)) + 0.0  # + 0.0: never print -0.0000

    def result(interval: tuple[float, float], outcome: Outcome, needed_n: int | None, test: PairedTest,
               p_value: float | None, widest: str | None = None, too_few: str | None = None) -> PairedResult:
        return PairedResult(
            metric=candidate.metric, n=n, candidate_mean=float(np.mean(cand)), baseline_mean=float(np.mean(base)),
            difference=difference, interval=interval, margin=margin, outcome=outcome, needed_n=needed_n, test=test,
            p_value=p_value, confidence=confidence, greater_is_better=candidate.greater_is_better, widest=widest,
            too_few=too_few)

    if candidate.kind == "binary":
        # Oriented: "only the candidate right" is the better side's cell.
        table = Table.of(cand, base) if sign > 0 else Table.of(1 - cand, 1 - base)
        low, high = newcombe(table, z_of(confidence))
        outcome = _outcome(low, high, margin)
        needed = None if outcome != "underpowered" else \
            binary_needed_n(table, margin, confidence, non_inferior_side=difference > -margin)
        return result((low, high), outcome, needed, "mcnemar-exact", mcnemar_p(table))
    differences = sign * (cand - base)
    found = continuous(differences, _width(candidate), confidence, seed)
    outcome = _outcome(found.low, found.high, margin)
    too_few = None
    if n < MIN_CONTINUOUS_ROWS:
        outcome = "underpowered"
        too_few = f"{n} row{'s' if n != 1 else ''}: a continuous metric decides from {MIN_CONTINUOUS_ROWS} rows"
    spread = float(np.std(differences, ddof=1)) if n > 1 else 0.0
    needed = None if outcome != "underpowered" else \
        continuous_needed_n(difference, spread, n, margin, _width(candidate), confidence)
    interval = (found.low + 0.0, found.high + 0.0)  # never -0.0000 (lower-is-better flips the sign of zeros)
    return result(interval, outcome, needed, "paired-bootstrap", None, found.widest, too_few)


def _outcome(low: float, high: float, margin: float) -> Outcome:
    if low > -margin:
        return "non_inferior"
    return "inferior" if high < -margin else "underpowered"


def _width(scores: SampleScores) -> float | None:
    return None if scores.bounds is None else scores.bounds[1] - scores.bounds[0]


def _check_arguments(candidate: SampleScores, baseline: SampleScores, margin: float,
                     confidence: float) -> None:
    if (candidate.metric, candidate.kind, candidate.greater_is_better, candidate.bounds) != \
            (baseline.metric, baseline.kind, baseline.greater_is_better, baseline.bounds):
        raise ValueError(f"cannot pair {candidate.metric} ({candidate.kind}) with {baseline.metric} "
                         f"({baseline.kind}): both sides must score the same metric the same way")
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"{candidate.metric}: the non-inferiority margin must be a number >= 0, "
                         f"got {margin}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def _pair(candidate: SampleScores, baseline: SampleScores) -> tuple[np.ndarray, np.ndarray]:
    """The two sides' values in the same sample order; every sample must be scored on both sides."""
    base_by_id = dict(zip(baseline.ids, baseline.values, strict=True))
    only_candidate = [i for i in candidate.ids if i not in base_by_id]
    only_baseline = sorted(set(baseline.ids) - set(candidate.ids))
    if only_candidate or only_baseline:
        examples = ", ".join(repr(i) for i in (only_candidate + only_baseline)[:3])
        raise ValueError(f"{candidate.metric}: {len(only_candidate)} samples scored only for the candidate "
                         f"and {len(only_baseline)} only for the baseline (e.g. {examples}); "
                         "both must score the same samples to be paired")
    if not candidate.ids:
        raise ValueError(f"{candidate.metric}: no samples to compare")
    cand = np.asarray(candidate.values, dtype=np.float64)
    base = np.asarray([base_by_id[i] for i in candidate.ids], dtype=np.float64)
    if not (np.all(np.isfinite(cand)) and np.all(np.isfinite(base))):
        raise ValueError(f"{candidate.metric}: a per-sample value is not finite (nan or inf)")
    return cand, base
