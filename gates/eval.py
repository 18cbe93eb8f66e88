"""The eval gate: task metrics of the packaged model on an eval set, against thresholds and production.

The model runs through its backend (release.backends), the runtime that serves it. Exact match compares
the greedy generation with `expected` after stripping; token accuracy and perplexity score the tokens
of `separator + expected` (+ EOS) under teacher forcing. Production's metrics come from its version
tags when they were measured on an eval set with the same sha256, else they are computed here on the
production package in the same run.

With `margins`, the candidate is also compared with production and with the fp32 reference (where the
release built one) sample by sample, per metric, against a non-inferiority margin (gates/eval_paired.py,
gates/paired.py): inferior fails the gate, too few rows to decide is "underpowered", which never passes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gates.base import GateContext, GateResult, GateStatus, Problem, ProductionRef, ThresholdCheck, missing_file
from gates.eval_data import DataRules, EvalRow, EvalSet, load_eval_set, separator_warning
from gates.eval_paired import (
    BASELINES,
    PAIRED_FILE,
    SAMPLES_FILE,
    Baseline,
    Comparison,
    Side,
    compare_sides,
    describe_scores,
    harness_comparisons,
    harness_of,
    margin_problems,
    paired_status,
    with_verdicts,
    write_paired,
    write_samples,
)
from gates.eval_scoring import (
    BatchScoring,
    fits_batched,
    forced_ids,
    rows_from_json,
    rows_to_json,
    score_batched,
    target_scores,
)
from gates.harness.config import HarnessTask, resolve_path, task_problems
from gates.harness.run import run_tasks
from gates.metrics import Metric, ScoredRow, resolve_metrics
from gates.packaged import complete, load_package_model
from gates.precision_eval import PairedJudge
from gates.thresholds import MetricThreshold, check_metric
from release.backends.base import LoadedModel
from release.core.errors import ConfigError, InputError
from release.gating.reference import ReferenceModel

EVIDENCE_FILE = "eval-predictions.jsonl"
MAX_EXAMPLES = 20
SHA_TAG = "gate.eval.dataset_sha256"
REFERENCE_ROWS = "eval-reference-rows"   # what the release's reference cache keeps for this gate
SCORING_VERSION = 1                      # bump when score_rows would score the same rows differently


class EvalConfig(BaseModel):
    """`gates.eval` in release.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Path | None = Field(default=None, description="eval JSONL; default: the run's data/eval.jsonl artifact")
    metrics: list[str] = Field(default_factory=lambda: ["exact_match", "token_accuracy", "perplexity"])
    thresholds: dict[str, MetricThreshold] = Field(default_factory=dict)
    max_new_tokens: int = Field(default=16, ge=1, le=1024)
    separator: str = Field(default=" ", description="token accuracy and perplexity score prompt + separator + "
                           "expected: the text between them in the model's format; '' when each expected already "
                           "starts with its own (a model continuation such as ' 42')")
    expectations: DataRules = DataRules()
    # --- paired comparison (issue 29 step 3; gates/eval_paired.py) ---
    margins: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        default_factory=dict, description="non-inferiority margin per metric, in its per-sample units "
        "(exact_match 0.02 = two points; perplexity: nats of mean NLL per token); see docs/paired-eval.md")
    against: list[Baseline] = Field(
        default_factory=lambda: list(BASELINES), min_length=1,
        description="what the margins compare the candidate with: production, and the fp32 reference where "
                    "the release built one")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="two-sided level of the intervals")
    # --- end paired comparison ---
    tasks: list[HarnessTask] = Field(default_factory=list, description="standard eval tasks (lm-eval, Inspect) run "
                                                                       "through the served candidate and production")

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, names: list[str]) -> list[str]:
        resolve_metrics(names)  # raises ConfigError with a did-you-mean hint
        if not names:
            raise ValueError("list at least one metric")
        return names

    @model_validator(mode="after")
    def _thresholds_on_metrics(self) -> EvalConfig:
        for name in self.thresholds:
            if name not in self.metrics:
                raise ConfigError(f"release.yaml: gates.eval.thresholds.{name}: '{name}' is not in gates.eval.metrics",
                                  hint="add it to metrics or remove the threshold "
                                       f"(metrics: {', '.join(self.metrics)})")
        return self

    @field_validator("margins")
    @classmethod
    def _margins_not_negative(cls, margins: dict[str, float]) -> dict[str, float]:
        for name, margin in margins.items():
            if margin < 0:
                raise ConfigError(f"release.yaml: gates.eval.margins.{name}: {margin:g} is negative",
                                  hint="a margin is how much worse than the baseline the candidate may be: a "
                                       "number >= 0 in the metric's units (exact_match: 0.02 = two points)")
        return margins


class EvalGate:
    """Scores the candidate (and production, when needed) on the eval set and checks the thresholds."""

    id: ClassVar[str] = "eval"
    Config: ClassVar[type[BaseModel]] = EvalConfig

    def __init__(self, config: EvalConfig) -> None:
        self.config = config

    @property
    def bounded(self) -> bool:
        """Whether any metric has a bound: with none the gate checks nothing, whatever the model scores."""
        return bool(self.config.margins) or any(
            t.threshold is not None or t.min_absolute_change is not None or t.min_relative_change is not None
            for t in self.config.thresholds.values())

    def preflight(self, config_dir: Path | None) -> list[Problem]:
        found = missing_file("gates.eval.dataset", self.config.dataset, config_dir) if self.config.dataset else None
        problems = [found] if found else []
        problems += self._margin_problems()
        problems += task_problems(self.config.tasks, config_dir)
        if not self.bounded:
            # Refused before any stage (check and promote): a gate that cannot fail must never read "pass".
            problems.append(Problem("release.yaml: gates.eval sets no thresholds, so the eval gate would pass "
                                    "whatever the model scores (0% exact match included)",
                                    "bound at least one metric, e.g. thresholds: {exact_match: {threshold: 0.8}}, "
                                    "or remove the gates.eval block"))
        return problems

    def warnings(self, config_dir: Path | None, eval_dataset: Path | None) -> list[str]:
        """Expected strings that start with whitespace while the separator adds its own (gates/eval_data.py)."""
        path = resolve_path(self.config.dataset, config_dir) if self.config.dataset else eval_dataset
        if path is None or not _needs_logits(resolve_metrics(self.config.metrics)):
            return []  # exact match strips both sides: only the teacher-forced metrics read the separator
        found = separator_warning(path, self.config.separator)
        return [found] if found else []

    def _margin_problems(self) -> list[Problem]:
        return margin_problems(self.config.margins, self.config.metrics, resolve_metrics(self.config.metrics),
                               frozenset(t.harness for t in self.config.tasks))

    def paired_judge(self, context: GateContext, reference: Callable[[], LoadedModel]) -> PairedJudge:
        """`precision: auto`'s paired eval of each variant against `reference` on this gate's rows, per sample,
        at gates.eval.margins (gates/precision_eval.py)."""
        path = context.resolve(self.config.dataset) if self.config.dataset else context.eval_dataset
        if path is None:
            raise InputError("precision: auto: the paired eval needs an eval set",
                             hint="set gates.eval.dataset or log data/eval.jsonl with the run")
        # The gate's own metrics (a harness task's margins compare the served candidate with production by the
        # harness's sample ids, not a variant with the reference).
        margins = {m: v for m, v in self.config.margins.items() if m in self.config.metrics}
        # Scored as the gate itself scores (every metric's needs): the gate then reuses the reference's rows.
        needs = _needs_logits(resolve_metrics(self.config.metrics))
        data = load_eval_set(path, self.config.expectations)
        return PairedJudge(data.rows, margins, lambda model, rows: score_rows(model, rows, self.config, needs),
                           lambda: reference_rows(reference, data, self.config, needs, "precision: auto"),
                           confidence=self.config.confidence)

    def run(self, context: GateContext) -> GateResult:
        path = context.resolve(self.config.dataset) if self.config.dataset else context.eval_dataset
        if path is None:
            raise InputError("eval gate: no eval set",
                             hint="set gates.eval.dataset or log data/eval.jsonl with the run")
        problems = self._margin_problems()  # `relctl gate` runs no preflight: refuse them here too
        if problems:
            raise ConfigError(problems[0].message, hint=problems[0].hint)
        data = load_eval_set(path, self.config.expectations)
        metrics = resolve_metrics(self.config.metrics)
        rows = score_rows(load_package_model(context.package_dir), data.rows, self.config, _needs_logits(metrics))
        values = {m.name: m.compute(rows) for m in metrics}
        production, source, production_rows = self._production_metrics(context, data, metrics)
        checks, skipped = self._check(metrics, values, production)
        evidence = context.work_dir / EVIDENCE_FILE
        _write_predictions(evidence, data.rows, rows)
        harness = run_tasks(self.config.tasks, context.package_dir,
                            context.production.package_dir if context.production else None,
                            context.work_dir / "harness", context.config_dir) if self.config.tasks else None
        failing = [_example(row, scored) for row, scored in zip(data.rows, rows, strict=True) if not _correct(scored)]
        # --- paired comparison (issue 29 step 3) ---
        comparisons, paired_evidence, paired_skipped = self._paired(context, data, metrics, rows, production_rows)
        skipped += paired_skipped
        if harness is not None:  # margins on the harness tasks' metrics: candidate vs production, by sample id
            label = _production_label(context.production) if context.production else "production"
            found, notes = harness_comparisons(self.config.margins, harness.scores("candidate"),
                                               harness.scores("production") if harness.production else None,
                                               label, self.config.confidence)
            comparisons, skipped = comparisons + found, skipped + notes
        if paired_evidence or comparisons:  # every comparison, the eval set's and the harness tasks', in one file
            write_paired(context.work_dir / PAIRED_FILE, comparisons)
            paired_evidence.append(context.work_dir / PAIRED_FILE)
        # --- end paired comparison ---
        scores = with_verdicts(harness.task_scores(), comparisons) if harness is not None else []
        status, reason = self._verdict(checks, skipped, comparisons, len(rows))
        line = describe_scores(scores)  # each task's own score beside the paired verdict
        reason = f"{reason}; {line}" if line else reason
        return GateResult(
            gate=self.id, status=status,
            reason=reason, metrics=values, thresholds=checks,
            evidence=[evidence, *paired_evidence, *([harness.samples_file] if harness else [])],
            details={"dataset": str(path), "dataset_sha256": data.sha256, "rows": len(rows),
                     "production_version": context.production.version if context.production else None,
                     "production_metrics": production, "production_source": source,
                     "skipped_checks": skipped, "failing_examples": failing[:MAX_EXAMPLES],
                     "paired": [c.as_dict() for c in comparisons],
                     "harness": harness.record() if harness else None, "harness_scores": scores},
        )

    def _verdict(self, checks: list[ThresholdCheck], skipped: list[str], comparisons: list[Comparison],
                 rows: int) -> tuple[GateStatus, str]:
        # Run on its own (`relctl gate eval` without thresholds) the gate measures, but it has evaluated nothing.
        if not self.bounded:
            return "skipped", (f"not evaluated: {rows} rows measured, but gates.eval sets no thresholds to check "
                               "them against")
        if not checks and not comparisons and not self.config.thresholds:
            return "skipped", (f"not evaluated: {rows} rows measured, but the margins had nothing to compare "
                               "with (no production version, no fp32 reference)")
        thresholds: GateStatus = "pass" if all(c.passed for c in checks) else "fail"
        paired = paired_status(comparisons)
        status: GateStatus = "fail" if "fail" in (thresholds, paired) else paired
        lines = [c.describe() for c in comparisons]
        # What decided first: failed thresholds, then comparisons that did not pass, then the rest.
        undecided = [c.describe() for c in comparisons if not c.result.passed]
        if thresholds == "fail":
            return status, "; ".join([_reason(checks, skipped, rows), *undecided])
        if status != "pass":
            return status, "; ".join(undecided)
        return status, "; ".join([_reason(checks, skipped, rows), *lines])

    def _paired(self, context: GateContext, data: EvalSet, metrics: list[Metric], rows: list[ScoredRow],
                production_rows: list[ScoredRow] | None) -> tuple[list[Comparison], list[Path], list[str]]:
        """Candidate vs each baseline per margin; (comparisons, evidence files, notes on baselines left out)."""
        if not any(harness_of(name) is None for name in self.config.margins):
            return [], [], []
        needs = _needs_logits(metrics)
        baselines: list[Side] = []
        notes: list[str] = []
        if "production" in self.config.against:
            if context.production is None:
                notes.append("no production version: paired comparison with production skipped")
            else:
                if production_rows is None:  # recorded numbers have no per-row values: score production here
                    production_rows = score_rows(load_package_model(context.production.package_dir), data.rows,
                                                 self.config, needs)
                baselines.append(Side("production", _production_label(context.production), production_rows))
        if "reference" in self.config.against:
            if context.load_reference is None:
                notes.append("no fp32 reference in this run: paired comparison with the reference skipped")
            else:
                scored, _ = reference_rows(context.load_reference, data, self.config, needs, "eval gate")
                baselines.append(Side("reference", "fp32 reference", scored))
        candidate = Side("candidate", "candidate", rows)
        comparisons = compare_sides(metrics, self.config.margins, data.rows, candidate, baselines,
                                    self.config.confidence)
        samples = context.work_dir / SAMPLES_FILE  # eval-paired.json is written by run, harness comparisons included
        write_samples(samples, metrics, data.rows, [candidate, *baselines])
        return comparisons, [samples], notes

    def _production_metrics(self, context: GateContext, data: EvalSet, metrics: list[Metric]
                            ) -> tuple[dict[str, float] | None, str | None, list[ScoredRow] | None]:
        """Production's values on this very eval set: from its tags when the digest matches (and no margin
        needs its per-row values), else computed; with its scored rows when computed."""
        if context.production is None:
            return None, None, None
        recorded = _recorded_metrics(context.production, data.sha256, metrics)
        if recorded is not None and not (any(harness_of(n) is None for n in self.config.margins)
                                        and "production" in self.config.against):
            return recorded, "recorded", None
        model = load_package_model(context.production.package_dir)
        rows = score_rows(model, data.rows, self.config, _needs_logits(metrics))
        return {m.name: m.compute(rows) for m in metrics}, "computed", rows

    def _check(self, metrics: list[Metric], values: dict[str, float],
               production: dict[str, float] | None) -> tuple[list[ThresholdCheck], list[str]]:
        checks: list[ThresholdCheck] = []
        skipped: list[str] = []
        for metric in metrics:
            bounds = self.config.thresholds.get(metric.name)
            if bounds is None:
                continue
            prod = production.get(metric.name) if production else None
            found, notes = check_metric(metric.name, values[metric.name], bounds, prod, metric.greater_is_better)
            checks += found
            skipped += notes
        return checks, skipped


def score_rows(model: LoadedModel, rows: tuple[EvalRow, ...], config: EvalConfig,
               needs_logits: bool) -> list[ScoredRow]:
    """Generate for every row, and score the expected tokens under teacher forcing when asked: a batch of rows
    per forward on a model that batches (the PyTorch reference, gates/eval_scoring.py), else row by row."""
    if isinstance(model, BatchScoring) and fits_batched(model, rows, config.max_new_tokens, config.separator):
        return score_batched(model, model, rows, config.max_new_tokens, config.separator, needs_logits)
    scored: list[ScoredRow] = []
    for row in rows:
        output = complete(model, row.prompt, config.max_new_tokens)
        logprobs, hits = _teacher_forced(model, row, config.separator) if needs_logits else (None, None)
        scored.append(ScoredRow(row.prompt, row.expected, output, logprobs, hits))
    return scored


def reference_rows(reference: Callable[[], LoadedModel], data: EvalSet, config: EvalConfig,
                   needs_logits: bool, by: str) -> tuple[list[ScoredRow], bool]:
    """(rows, reused): the fp32 reference's scored rows of this eval set. A release's reference
    (release/gating/reference.py) scores them once, kept by its content digest with the eval set's digest and
    these scoring settings, so `precision: auto`'s paired eval and this gate share one scoring."""
    if not isinstance(reference, ReferenceModel):
        return score_rows(reference(), data.rows, config, needs_logits), False
    settings = {"eval_set_sha256": data.sha256, "max_new_tokens": config.max_new_tokens,
                "separator": config.separator, "needs_logits": needs_logits, "scoring": SCORING_VERSION}
    value, reused = reference.computed(
        REFERENCE_ROWS, settings, lambda model: rows_to_json(score_rows(model, data.rows, config, needs_logits)), by)
    return rows_from_json(value), reused


def _teacher_forced(model: LoadedModel, row: EvalRow,
                    separator: str) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """Log-probability and argmax hit of each target token (the answer's tokens, then EOS)."""
    full_ids, start = forced_ids(model, row.prompt, row.expected, separator)
    return target_scores(model.logits(full_ids[:-1])[start - 1:], full_ids[start:])


def _production_label(production: ProductionRef) -> str:
    version = production.version  # a registry version, or `relctl gate --baseline`'s label
    return f"production v{version}" if version.isdigit() else f"production {version}"


def _needs_logits(metrics: list[Metric]) -> bool:
    return any(m.needs_logits for m in metrics)


def _recorded_metrics(production: ProductionRef, sha256: str, metrics: list[Metric]) -> dict[str, float] | None:
    """Production's scores recorded at its release, if they were taken on this very eval set."""
    if production.tags.get(SHA_TAG) != sha256:
        return None
    try:
        values = {m.name: float(production.metrics[f"gate.eval.{m.name}"]) for m in metrics}
    except KeyError:
        return None
    return values if all(math.isfinite(v) for v in values.values()) else None


def _correct(row: ScoredRow) -> bool:
    return row.output.strip() == row.expected.strip()


def _example(row: EvalRow, scored: ScoredRow) -> dict[str, Any]:
    return {"line": row.line, "prompt": row.prompt, "expected": row.expected, "output": scored.output}


def _write_predictions(path: Path, rows: tuple[EvalRow, ...], scored: list[ScoredRow]) -> None:
    lines = [json.dumps({**_example(r, s), "correct": _correct(s)}) for r, s in zip(rows, scored, strict=True)]
    path.write_text("".join(line + "\n" for line in lines))


def _reason(checks: list[ThresholdCheck], skipped: list[str], rows: int) -> str:
    failed = [c for c in checks if not c.passed]
    if failed:
        return "; ".join(describe_check(c) for c in failed)
    note = " (no production version: no-regression checks skipped)" if skipped else ""
    return f"{rows} rows: every metric within its thresholds{note}"


def describe_check(check: ThresholdCheck) -> str:
    """One line: metric, value, the bound it missed or met, and production's value."""
    value = "n/a" if check.value is None else f"{check.value:.4g}"
    prod = "" if check.production is None else f", production {check.production:.4g}"
    return f"{check.metric} {value} (needs {check.op} {check.bound:.4g}, {check.kind}{prod})"
