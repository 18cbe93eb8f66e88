"""The eval gate's paired comparison (`gates.eval.margins`): candidate vs production, and vs the fp32
reference where the release built one, sample by sample (gates/paired.py), written as evidence.

The paired unit is the eval row, identified by its line in the eval set (the same file on every side: the
gate reads it once). Per row: exact_match is 0/1 (exact McNemar); token_accuracy is the row's share of
target tokens predicted and perplexity the row's mean negative log-likelihood per target token in nats,
both continuous (paired bootstrap). Margins are in those units: exact_match 0.02 = two points of exact
match; perplexity 0.01 = a mean NLL 0.01 nats higher, a perplexity about 1 % higher.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from gates.base import Problem
from gates.eval_data import EvalRow
from gates.metrics import Metric, ScoredRow, per_sample, sample_bounds
from gates.paired import PairedResult, compare
from gates.samples import SampleScores
from release.core.errors import InputError

SAMPLES_FILE = "eval-samples.jsonl"   # every row's per-sample values on every side
PAIRED_FILE = "eval-paired.json"      # every comparison's n, difference, interval, margin and outcome
Baseline = Literal["production", "reference"]
BASELINES: tuple[Baseline, ...] = ("production", "reference")


@dataclass(frozen=True)
class Side:
    """One model's scored rows: `role` is candidate / production / reference, `label` how the report names it."""

    role: str
    label: str
    rows: Sequence[ScoredRow]


@dataclass(frozen=True)
class Comparison:
    against: str   # the baseline's label ("production v3", "fp32 reference")
    result: PairedResult

    def describe(self) -> str:
        return f"vs {self.against}: {self.result.describe()}"

    def as_dict(self) -> dict[str, Any]:
        return {"against": self.against, **asdict(self.result), "line": self.describe()}


# A margin on a harness task's metric is named as its SampleScores are: "<harness>/<task>/<metric>".
HARNESS_PREFIXES = {"lm_eval/": "lm-eval", "inspect/": "inspect"}


def harness_of(name: str) -> str | None:
    """The harness a margin's metric belongs to ("lm-eval", "inspect"), or None for a JSONL metric."""
    return next((h for prefix, h in HARNESS_PREFIXES.items() if name.startswith(prefix)), None)


def margin_problems(margins: Mapping[str, float], metric_names: Sequence[str],
                    resolved: Sequence[Metric], harnesses: frozenset[str] = frozenset()) -> list[Problem]:
    """Every margin that names a metric the gate does not compute, or one with no per-sample form.
    `harnesses`: the harnesses gates.eval.tasks runs; a margin on their metrics is checked when they ran
    (a task's metric names are the harness's to give)."""
    problems: list[Problem] = []
    by_name = {m.name: m for m in resolved}
    for name in margins:
        harness = harness_of(name)
        if harness is not None:
            if harness not in harnesses:
                problems.append(Problem(
                    f"release.yaml: gates.eval.margins.{name}: no {harness} task in gates.eval.tasks, so the "
                    "margin compares nothing",
                    f"add a {harness} task to gates.eval.tasks or remove the margin"))
            continue
        if name not in metric_names:
            problems.append(Problem(
                f"release.yaml: gates.eval.margins.{name}: '{name}' is not in gates.eval.metrics, so the "
                "margin compares nothing",
                f"add '{name}' to gates.eval.metrics or remove its margin (metrics: {', '.join(metric_names)})"))
        elif name in by_name and per_sample(by_name[name]) is None:
            problems.append(Problem(
                f"release.yaml: gates.eval.margins.{name}: metric '{name}' has no per-sample score, so it "
                "cannot be compared sample by sample",
                "remove its margin (bound it with thresholds), or give the metric sample_kind and "
                "score_sample (gates/metrics.py)"))
    return problems


def sample_scores(metric: Metric, data: Sequence[EvalRow], rows: Sequence[ScoredRow]) -> SampleScores:
    """One side's per-row values of `metric`, each row identified by its line in the eval set."""
    kind = per_sample(metric)
    if kind is None:
        raise ValueError(f"{metric.name} has no per-sample score")
    score = metric.score_sample  # type: ignore[attr-defined]
    return SampleScores(metric.name, kind, metric.greater_is_better, tuple(str(r.line) for r in data),
                        tuple(float(score(s)) for s in rows), sample_bounds(metric))


def compare_sides(metrics: Sequence[Metric], margins: Mapping[str, float], data: Sequence[EvalRow],
                  candidate: Side, baselines: Sequence[Side], confidence: float) -> list[Comparison]:
    """Each margin's metric, candidate against each baseline, in release.yaml order."""
    by_name = {m.name: m for m in metrics}
    out: list[Comparison] = []
    for base in baselines:
        for name, margin in margins.items():
            if harness_of(name) is not None:
                continue  # harness task metrics: harness_comparisons
            metric = by_name[name]
            result = compare(sample_scores(metric, data, candidate.rows), sample_scores(metric, data, base.rows),
                             margin, confidence=confidence)
            out.append(Comparison(base.label, result))
    return out


def harness_comparisons(margins: Mapping[str, float], candidate: Sequence[SampleScores],
                        production: Sequence[SampleScores] | None, production_label: str,
                        confidence: float) -> tuple[list[Comparison], list[str]]:
    """Each margin on a harness task's metric, candidate against production, paired by the harness's sample
    ids; (comparisons, notes). A margin may leave out lm-eval's filter suffix ("lm_eval/t/acc" matches
    "lm_eval/t/acc,none"). A margin that matches no metric the tasks produced is an error naming them; the
    fp32 reference is a checkpoint, not a served model, so harness tasks compare with production only."""
    wanted = {name: margin for name, margin in margins.items() if harness_of(name) is not None}
    if not wanted:
        return [], []
    by_metric = {s.metric: s for s in candidate}
    out: list[Comparison] = []
    for name, margin in wanted.items():
        found = [s for s in candidate if s.metric == name or s.metric.split(",")[0] == name]
        if not found:
            raise InputError(f"gates.eval.margins.{name}: the harness tasks produced no such metric",
                             hint="name one of: " + ", ".join(sorted(by_metric)) if by_metric
                             else "the tasks produced no per-sample metric")
        if production is None:
            continue
        theirs = {s.metric: s for s in production}
        for scores in found:
            if scores.metric in theirs:
                out.append(Comparison(production_label, compare(scores, theirs[scores.metric], margin,
                                                                confidence=confidence)))
    notes = ["production was not scored on the harness tasks: their margins were not compared"] \
        if production is None else []
    return out, notes


def with_verdicts(scores: Sequence[dict[str, Any]], comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """Harness task scores (gates/harness/results.py: task_scores) with their paired verdict where a margin
    compared them: `paired` = {against, outcome, difference, interval, margin, needed_n}, else None."""
    by_metric = {c.result.metric: c for c in comparisons}
    out = []
    for entry in scores:
        found = by_metric.get(entry["name"])
        verdict = None if found is None else {
            "against": found.against, "outcome": found.result.outcome, "difference": found.result.difference,
            "interval": list(found.result.interval), "margin": found.result.margin, "needed_n": found.result.needed_n}
        out.append({**entry, "paired": verdict})
    return out


def describe_scores(scores: Sequence[dict[str, Any]]) -> str | None:
    """One line: each task's own metrics, candidate beside production, e.g. `lm-eval reverse_mc: acc 0.750
    (production 0.667; paired: non-inferior)`; None when no harness task ran."""
    tasks: dict[tuple[str, str], list[str]] = {}
    for entry in scores:
        if not entry["own"]:
            continue
        figure = f"{entry['metric']} {entry['candidate']:.3f}"
        notes = [] if entry["production"] is None else [f"production {entry['production']:.3f}"]
        if entry.get("paired"):
            notes.append(f"paired: {entry['paired']['outcome'].replace('_', '-')}")
        tasks.setdefault((entry["harness"], entry["task"]), []).append(
            figure + (f" ({'; '.join(notes)})" if notes else ""))
    if not tasks:
        return None
    return "; ".join(f"{harness} {task}: {', '.join(figures)}" for (harness, task), figures in tasks.items())


def write_samples(path: Path, metrics: Sequence[Metric], data: Sequence[EvalRow], sides: Sequence[Side]) -> None:
    """One line per eval row: its id, prompt and expected answer, and per side the output and each
    per-sample value; the evidence a reader can recompute every comparison from."""
    paired = [m for m in metrics if per_sample(m) is not None]
    lines = []
    for i, row in enumerate(data):
        entry: dict[str, Any] = {"id": str(row.line), "prompt": row.prompt, "expected": row.expected}
        for side in sides:
            scored = side.rows[i]
            entry[side.role] = {"model": side.label, "output": scored.output,
                                **{m.name: m.score_sample(scored) for m in paired}}  # type: ignore[attr-defined]
        lines.append(json.dumps(entry))
    path.write_text("".join(line + "\n" for line in lines))


def write_paired(path: Path, comparisons: Sequence[Comparison]) -> None:
    path.write_text(json.dumps([c.as_dict() for c in comparisons], indent=2) + "\n")


def paired_status(comparisons: Sequence[Comparison]) -> Literal["pass", "fail", "underpowered"]:
    """inferior anywhere: fail; else undecided anywhere: underpowered (never a pass); else pass."""
    outcomes = {c.result.outcome for c in comparisons}
    if "inferior" in outcomes:
        return "fail"
    return "underpowered" if "underpowered" in outcomes else "pass"
