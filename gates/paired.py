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

Binary metrics (0/1 per sample): the exact McNemar test on the discordant pairs (``p_value``; its null is
"no difference", reported as evidence, not used for the decision) and Newcombe's square-and-add (Wilson
score) interval for a difference of paired proportions with the continuity-corrected correlation (Newcombe
1998, Stat. Med. 17:2635; recommended by Fagerland, Lydersen & Laake 2014, SMMR 23:1), which keeps its
coverage with few discordant pairs where a Wald interval does not. Continuous metrics: a seeded BCa
bootstrap of the mean per-sample difference (scipy.stats.bootstrap on the differences, i.e. resampling
pairs).

``needed_n`` estimates the sample size at which the interval would decide, assuming the observed
difference stays where it is and the interval narrows as 1/√n: the interval side that faces -margin has
half-width h at n samples and the observed gap to -margin is g, so N ≈ ⌈n·(h/g)²⌉. When the difference sits
exactly on -margin (g = 0) no sample size decides, and ``needed_n`` is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from gates.samples import SampleScores

Outcome = Literal["non_inferior", "inferior", "underpowered"]
PairedTest = Literal["mcnemar-exact", "paired-bootstrap"]

# Enough resamples that the seeded interval's ends move by well under a percent of its width between
# seeds; the batch bounds memory (batch x n floats) for eval sets of tens of thousands of rows.
_BOOTSTRAP_RESAMPLES = 9999
_BOOTSTRAP_BATCH = 500


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

    @property
    def passed(self) -> bool:
        """Only a shown non-inferiority passes; underpowered is not a pass."""
        return self.outcome == "non_inferior"

    def describe(self) -> str:
        """One line: n, the difference, its interval, the margin and what they decide."""
        low, high = self.interval
        direction = "" if self.greater_is_better else " (lower is better; sign flipped)"
        line = (f"{self.metric}: n={self.n}, difference {self.difference:+.4f}{direction}, "
                f"{self.confidence:.0%} CI [{low:+.4f}, {high:+.4f}], margin {self.margin:g}")
        if self.p_value is not None:
            line += f", McNemar exact p={self.p_value:.3g}"
        if self.outcome == "non_inferior":
            return f"{line}: non-inferior"
        if self.outcome == "inferior":
            return f"{line}: inferior (worse by more than the margin)"
        needs = f"needs about {self.needed_n} samples" if self.needed_n is not None else \
            "the difference sits on the margin; no sample size decides"
        return f"{line}: underpowered ({needs})"


def compare(candidate: SampleScores, baseline: SampleScores, margin: float, *,
            confidence: float = 0.95, seed: int = 0) -> PairedResult:
    """Compare `candidate` with `baseline` on the samples both scored, at non-inferiority `margin`.

    `margin` is in the metric's own units (0.02 = two points of exact match). Raises ValueError when the
    two sides are not the same metric, do not cover the same samples, or the arguments are out of range.
    """
    _check_arguments(candidate, baseline, margin, confidence)
    cand, base = _pair(candidate, baseline)
    sign = 1.0 if candidate.greater_is_better else -1.0
    if candidate.kind == "binary":
        low, high, p_value = _binary_interval(cand, base, confidence)
        test: PairedTest = "mcnemar-exact"
    else:
        low, high = _bootstrap_interval(cand - base, confidence, seed)
        p_value, test = None, "paired-bootstrap"
    raw = float(np.mean(cand - base))
    difference = sign * raw
    low, high = sorted((sign * low, sign * high))
    outcome, needed_n = _decide(difference, low, high, margin, len(cand))
    return PairedResult(
        metric=candidate.metric, n=len(cand), candidate_mean=float(np.mean(cand)),
        baseline_mean=float(np.mean(base)), difference=difference, interval=(low, high), margin=margin,
        outcome=outcome, needed_n=needed_n, test=test, p_value=p_value, confidence=confidence,
        greater_is_better=candidate.greater_is_better)


def _check_arguments(candidate: SampleScores, baseline: SampleScores, margin: float,
                     confidence: float) -> None:
    if (candidate.metric, candidate.kind, candidate.greater_is_better) != \
            (baseline.metric, baseline.kind, baseline.greater_is_better):
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


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def _binary_interval(cand: np.ndarray, base: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Newcombe's square-and-add interval on p(candidate) - p(baseline), and McNemar's exact p-value."""
    n = len(cand)
    a = int(np.sum((cand == 1) & (base == 1)))
    b = int(np.sum((cand == 1) & (base == 0)))  # only the candidate right
    c = int(np.sum((cand == 0) & (base == 1)))  # only the baseline right
    d = n - a - b - c
    p_value = 1.0 if b + c == 0 else float(stats.binomtest(b, b + c, 0.5).pvalue)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = _wilson(a + b, n, z)
    l2, u2 = _wilson(a + c, n, z)
    # The correlation of the two marginal proportions, continuity-corrected towards zero as in Newcombe's
    # square-and-add interval (Fagerland, Lydersen & Laake 2014 recommend it for paired proportions).
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else float(cross))
    phi = 0.0 if margins == 0 else corrected / math.sqrt(margins)
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    epsilon = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    theta = p1 - p2
    return max(-1.0, theta - delta), min(1.0, theta + epsilon), p_value


def _bootstrap_interval(differences: np.ndarray, confidence: float, seed: int) -> tuple[float, float]:
    """Seeded BCa bootstrap interval of the mean per-sample difference (resampling pairs)."""
    if np.ptp(differences) == 0:
        # Every pair differs by the same amount (identical models: all zero): every resample has that
        # mean, and BCa's acceleration is undefined (scipy would answer nan with a warning).
        value = float(differences[0])
        return value, value
    result = stats.bootstrap((differences,), np.mean, n_resamples=_BOOTSTRAP_RESAMPLES,
                             batch=_BOOTSTRAP_BATCH, confidence_level=confidence, method="BCa",
                             random_state=np.random.default_rng(seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):  # BCa degenerate on very few distinct values
        result = stats.bootstrap((differences,), np.mean, n_resamples=_BOOTSTRAP_RESAMPLES,
                                 batch=_BOOTSTRAP_BATCH, confidence_level=confidence,
                                 method="percentile", random_state=np.random.default_rng(seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return low, high


def _decide(difference: float, low: float, high: float, margin: float, n: int) -> tuple[Outcome, int | None]:
    bound = -margin
    if low > bound:
        return "non_inferior", None
    if high < bound:
        return "inferior", None
    # The side of the interval facing -margin must clear it: the low side when the estimate is above the
    # bound (to show non-inferiority), the high side when below (to show inferiority).
    if difference > bound:
        half, gap = difference - low, difference - bound
    else:
        half, gap = high - difference, bound - difference
    if gap <= 0 or half <= 0:
        return "underpowered", None
    return "underpowered", max(n + 1, math.ceil(n * (half / gap) ** 2))
