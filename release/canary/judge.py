"""The canary judge: pure statistics, no I/O. Candidate and production samples from the same interval in,
typed per-metric verdicts and a step verdict out.

Latency metrics (continuous): Mann-Whitney U (scipy) for the p-value, and a Hodges-Lehmann estimate of
the shift (candidate - production) with its distribution-free confidence interval: the order statistics
of the m*n pairwise differences whose ranks invert the U test (Lehmann 1975; Kayenta's judge does the
same). The exact null distribution of U is used without ties for small samples, the tie-corrected normal
approximation otherwise.

Proportions (error rate, output quality): Fisher's exact test (one-sided, in the bad direction) for the
p-value, Newcombe's hybrid score interval for the difference of the two proportions.

A metric fails when its whole interval lies beyond the allowed change in its bad direction (and, for
proportions, Fisher's test is significant too); with fewer than `min_samples` on either side it is
inconclusive, which never counts as a pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy import stats

Verdict = Literal["pass", "fail", "inconclusive"]
MetricKind = Literal["continuous", "proportion"]
# Exact U distribution below this many pairs (and no ties): the polynomial it needs stays small.
EXACT_MAX_PAIRS = 2500


class MetricRule(BaseModel):
    """How one metric is judged. The allowed change is the larger of the relative and absolute ones set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: MetricKind = "continuous"
    bad: Literal["increase", "decrease"] = Field(default="increase", description="which direction is a regression")
    allowed_relative: float | None = Field(default=None, ge=0,
                                           description="share of production's value (median or rate)")
    allowed_absolute: float | None = Field(default=None, ge=0, description="in the metric's unit (ms, or a rate 0..1)")
    critical: bool = Field(default=False, description="a failed (or inconclusive) critical metric fails the step")
    min_samples: int = Field(default=10, ge=1, description="fewer on either side: inconclusive")

    @model_validator(mode="after")
    def _proportion_change(self) -> MetricRule:
        if self.kind == "proportion" and self.allowed_absolute is not None and self.allowed_absolute > 1:
            raise ValueError("allowed_absolute of a proportion is a rate between 0 and 1")
        return self

    def allowed(self, baseline: float) -> float:
        """The tolerated shift in the bad direction, for production's value `baseline`."""
        options = [self.allowed_absolute or 0.0]
        if self.allowed_relative is not None:
            options.append(self.allowed_relative * abs(baseline))
        return max(options)


@dataclass(frozen=True)
class Proportion:
    """A 0/1 metric on one side: `hits` of `n` (errors of requests, correct answers of known ones)."""

    hits: int
    n: int

    @property
    def rate(self) -> float:
        return self.hits / self.n if self.n else math.nan


@dataclass(frozen=True)
class MetricResult:
    """One metric at one check. `shift` and `interval` are candidate minus production."""

    metric: str
    kind: MetricKind
    test: str
    verdict: Verdict
    critical: bool
    n_production: int
    n_candidate: int
    production: float | None      # median (continuous) or rate (proportion)
    candidate: float | None
    statistic: float | None       # U of the candidate sample, or Fisher's odds ratio
    p_value: float | None
    shift: float | None
    interval: tuple[float, float] | None
    bound: float | None           # the allowed shift, signed in the bad direction
    reason: str
    bad: Literal["increase", "decrease"] = "increase"

    def to_json(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class StepJudgement:
    """One check: every metric's result, the score (share of passing metrics) and the verdict."""

    metrics: list[MetricResult]
    score: float
    verdict: Verdict
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"score": self.score, "verdict": self.verdict, "reason": self.reason,
                "metrics": [m.to_json() for m in self.metrics]}


def shift_interval(production: Sequence[float], candidate: Sequence[float], confidence: float
                   ) -> tuple[float, tuple[float, float]]:
    """Hodges-Lehmann shift (candidate - production) and its distribution-free interval at `confidence`.

    The interval is [D_(k), D_(mn+1-k)] over the sorted pairwise differences D, k the largest rank with
    P(U <= k - 1) <= alpha/2 under the null: the set of shifts the two-sided U test does not reject.
    Too few samples for any k: (-inf, inf).
    """
    x = np.asarray(production, dtype=float)
    y = np.asarray(candidate, dtype=float)
    m, n = len(x), len(y)
    diffs = np.sort(np.subtract.outer(y, x).ravel())
    estimate = float(np.median(diffs))
    k = _rank(x, y, 1.0 - confidence)
    if k < 1:
        return estimate, (-math.inf, math.inf)
    return estimate, (float(diffs[k - 1]), float(diffs[m * n - k]))


def _rank(x: np.ndarray, y: np.ndarray, alpha: float) -> int:
    m, n = len(x), len(y)
    pooled = np.concatenate([x, y])
    ties = len(np.unique(pooled)) < len(pooled)
    if m * n <= EXACT_MAX_PAIRS and not ties:
        cdf = np.cumsum(_u_distribution(m, n))
        # cdf[c] = P(U <= c); the largest k with cdf[k - 1] <= alpha / 2.
        return int(np.searchsorted(cdf, alpha / 2, side="right"))
    _, counts = np.unique(pooled, return_counts=True)
    total = m + n
    tie_term = float(np.sum(counts.astype(float) ** 3 - counts)) / (total * (total - 1))
    sigma = math.sqrt(m * n / 12.0 * ((total + 1) - tie_term))
    z = float(stats.norm.ppf(1 - alpha / 2))
    return max(0, math.floor(m * n / 2 - z * sigma + 0.5))


def _u_distribution(m: int, n: int) -> np.ndarray:
    """P(U = u), u = 0..mn, without ties: the coefficients of the Gaussian binomial [m+n choose m]_q."""
    poly = np.zeros(m * n + 1)
    poly[0] = 1.0
    for i in range(1, m + 1):
        # Multiply by (1 - q^(n+i)), then divide by (1 - q^i); both keep the coefficients exact counts.
        poly[n + i:] -= poly[: m * n + 1 - (n + i)].copy()
        for r in range(i):
            poly[r::i] = np.cumsum(poly[r::i])
    return np.asarray(poly / poly.sum())


def judge_continuous(name: str, rule: MetricRule, production: Sequence[float], candidate: Sequence[float],
                     confidence: float) -> MetricResult:
    """Mann-Whitney U and the Hodges-Lehmann interval of one latency-like metric."""
    m, n = len(production), len(candidate)
    med_p = float(np.median(production)) if m else None
    med_c = float(np.median(candidate)) if n else None
    if min(m, n) < rule.min_samples:
        return _inconclusive(name, rule, "mann-whitney", m, n, med_p, med_c)
    test = stats.mannwhitneyu(candidate, production, alternative="two-sided")
    shift, (lo, hi) = shift_interval(production, candidate, confidence)
    if math.isinf(lo) or math.isinf(hi):
        return _inconclusive(name, rule, "mann-whitney", m, n, med_p, med_c)
    allowed = rule.allowed(med_p or 0.0)
    bound = allowed if rule.bad == "increase" else -allowed
    failed = lo > bound if rule.bad == "increase" else hi < bound
    verdict: Verdict = "fail" if failed else "pass"
    reason = (f"shift {shift:+.3g} [{lo:+.3g}, {hi:+.3g}] at {confidence:.0%} "
              f"{'beyond' if failed else 'within'} the allowed {bound:+.3g}")
    return MetricResult(name, "continuous", "mann-whitney", verdict, rule.critical, m, n, med_p, med_c,
                        float(test.statistic), float(test.pvalue), shift, (lo, hi), bound, reason, rule.bad)


def newcombe_interval(candidate: Proportion, production: Proportion, confidence: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval for candidate.rate - production.rate (his method 10)."""
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    p1, p2 = candidate.rate, production.rate
    l1, u1 = _wilson(candidate, z)
    l2, u2 = _wilson(production, z)
    diff = p1 - p2
    return diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _wilson(p: Proportion, z: float) -> tuple[float, float]:
    rate, n = p.rate, p.n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def judge_proportion(name: str, rule: MetricRule, production: Proportion, candidate: Proportion,
                     confidence: float) -> MetricResult:
    """Fisher's exact test (one-sided, bad direction) and Newcombe's interval of the rate difference."""
    m, n = production.n, candidate.n
    rate_p = production.rate if m else None
    rate_c = candidate.rate if n else None
    if min(m, n) < rule.min_samples:
        return _inconclusive(name, rule, "fisher", m, n, rate_p, rate_c)
    table = [[candidate.hits, n - candidate.hits], [production.hits, m - production.hits]]
    test = stats.fisher_exact(table, alternative="greater" if rule.bad == "increase" else "less")
    p_value = float(test.pvalue)
    lo, hi = newcombe_interval(candidate, production, confidence)
    shift = candidate.rate - production.rate
    allowed = rule.allowed(production.rate)
    bound = allowed if rule.bad == "increase" else -allowed
    beyond = lo > bound if rule.bad == "increase" else hi < bound
    failed = beyond and p_value < 1 - confidence
    verdict: Verdict = "fail" if failed else "pass"
    reason = (f"{candidate.hits}/{n} vs {production.hits}/{m}: difference {shift:+.3g} [{lo:+.3g}, {hi:+.3g}], "
              f"Fisher p={p_value:.3g}; {'beyond' if failed else 'within'} the allowed {bound:+.3g}")
    return MetricResult(name, "proportion", "fisher", verdict, rule.critical, m, n, rate_p, rate_c,
                        float(test.statistic), p_value, shift, (lo, hi), bound, reason, rule.bad)


def _inconclusive(name: str, rule: MetricRule, test: str, m: int, n: int, prod: float | None,
                  cand: float | None) -> MetricResult:
    reason = f"too little data: {n} candidate and {m} production samples (needs {rule.min_samples} each)"
    return MetricResult(name, rule.kind, test, "inconclusive", rule.critical, m, n, prod, cand,
                        None, None, None, None, None, reason, rule.bad)


def judge_step(rules: Mapping[str, MetricRule], data: Mapping[str, tuple[Any, Any]], confidence: float = 0.98,
               pass_score: float = 0.75) -> StepJudgement:
    """Judge every metric in `rules` present in `data` ({metric: (production, candidate)}: sample lists for
    continuous metrics, Proportions for proportions). The step passes when no critical metric failed or
    was inconclusive and the share of passing metrics reaches `pass_score`; it is inconclusive (a failure
    too, never a pass) when nothing failed but too little data kept it from passing."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence}: must be between 0 and 1")
    results = []
    for name, rule in rules.items():
        if name not in data:
            continue
        prod, cand = data[name]
        if rule.kind == "proportion":
            results.append(judge_proportion(name, rule, prod, cand, confidence))
        else:
            results.append(judge_continuous(name, rule, prod, cand, confidence))
    if not results:
        return StepJudgement([], 0.0, "inconclusive", "no metric had data")
    score = sum(r.verdict == "pass" for r in results) / len(results)
    failed = [r for r in results if r.verdict == "fail"]
    critical_fail = [r for r in failed if r.critical]
    critical_unknown = [r for r in results if r.critical and r.verdict == "inconclusive"]
    verdict: Verdict
    if critical_fail:
        verdict, reason = "fail", "critical metric failed: " + ", ".join(r.metric for r in critical_fail)
    elif score >= pass_score and not critical_unknown:
        verdict, reason = "pass", f"score {score:.2f} >= {pass_score:.2f}"
    elif failed:
        verdict = "fail"
        reason = f"score {score:.2f} < {pass_score:.2f}: failed " + ", ".join(r.metric for r in failed)
    else:
        unknown = [r.metric for r in results if r.verdict == "inconclusive"]
        verdict, reason = "inconclusive", "too little data for " + ", ".join(unknown)
    return StepJudgement(results, score, verdict, reason)


def _finite(value: Any) -> Any:
    """JSON has no inf/nan: they become None (an interval with an open end keeps its other end)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, tuple):
        return [_finite(v) for v in value]
    return value
