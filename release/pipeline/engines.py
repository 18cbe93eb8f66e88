"""Engines side by side: one release measured on each engine and precision of release.yaml's `engines:`.

Each entry is built, validated against its fp32 reference on the run's prompts, planned for memory and
packaged by the same stages as the release itself (so the one that is released resumes from those folders,
bit for bit), then load-tested by the configured load gate (`gates.load`): the same seeded plan, the same
SLOs, the same cost formula (docs/metrics.md: GPU price per hour x GPUs / (output tokens/s x 3600) x 1e6, at
the rate the gate judged, where the SLOs still hold). One row per engine:

    engine | precision | top-1 / KL vs reference | TTFT p99 | TPOT p99 | at rate | output tok/s | $/M tokens
           | memory per replica (the stage's plan) | cold start (the engine's load time in `relctl serve`)

With `convert.backend: auto` the release takes the cheapest row that met quality and the SLOs and that no
other such row dominates on cost and paired quality (release/pipeline/ranking.py: ties break by paired
quality, then memory); every other row says why it was not taken. With an explicit backend the table is
evidence beside the release and selects nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from release.backends import AUTO, get_backend
from release.config import EngineConfig, ReleaseConfig
from release.core.errors import Blocked, InputError, ReleaseError
from release.core.progress import Progress
from release.core.units import size
from release.gating.contract import Gate, GateContext, GateResult, Problem
from release.gating.plugins import run_gate
from release.pipeline.frontier import frontier_section
from release.pipeline.ranking import capped_note, pick, tied, why_not, why_tied

__all__ = ["Comparison", "EngineBuild", "EngineRow", "choose", "compare_engines", "decide", "tied"]

LOAD_GATE = "load"


@dataclass
class EngineRow:
    """One engine at one precision, as measured in this release."""

    engine: str
    precision: str
    quality_passed: bool = False
    top1_agreement: float | None = None
    mean_kl: float | None = None
    slo_met: bool = False
    rate: float | None = None                 # req/s the load gate judged (the sweep's best when it sweeps)
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tokens_per_s: float | None = None
    cost_per_million_tokens: float | None = None
    memory_per_replica_bytes: int | None = None
    cold_start_s: float | None = None
    load_reason: str | None = None            # the load gate's own sentence
    rejected: str | None = None               # why auto did not (or could not) take it; None for the chosen one
    package_content_sha256: str | None = None
    # What stopped this engine's rate: its SLOs, errors, KV capacity or a queue (relctl's 429s), from the
    # sweep's first failing step; never relctl's queue when the backend declares its admission (issue 27).
    limited_by: str | None = None
    # Relative spread of output tok/s between the judged step and the same seeded plan sent again right after:
    # this row's repeat noise; rows whose costs differ by less than their noises together are a tie.
    noise: float | None = None
    # The load test never saturated the engine (every sweep step met the SLOs, or one fixed rate was offered):
    # its cost prices the offered load; two such rows at one hourly price are a tie (release/pipeline/ranking.py).
    capped: bool = False
    cost_per_hour: float | None = None        # the price the cost was computed with (GPUs x price per hour)
    # Under precision: auto, the paired difference from the fp32 reference on the first margin metric
    # (oriented: positive is better): what a tie on cost is broken by, and the frontier's quality axis.
    quality: float | None = None

    @property
    def label(self) -> str:
        return f"{self.engine} {self.precision}"


@dataclass
class EngineBuild:
    """What the pipeline built for one entry: the validation verdict, and when it passed, the package."""

    validation: dict[str, Any]
    package_dir: Path | None = None
    memory: dict[str, Any] | None = None
    content_sha256: str | None = None
    quality: float | None = None             # the paired quality a precision search measured (EngineRow.quality)


@dataclass
class Comparison:
    selection: str                            # "auto" (the table chose) | "fixed" (convert.backend chose)
    rows: list[EngineRow]
    chosen: EngineRow | None
    why: list[str] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    # The load gate's result per row label, when it ran as release.yaml configures it (no engine price of
    # its own): the release's own load gate on the same package would measure the same thing again.
    load_results: dict[str, GateResult] = field(default_factory=dict)

    def load_result_for(self, row: EngineRow | None, content_sha256: str | None) -> GateResult | None:
        """The load gate's result for `row` when its package is the one released (same content digest)."""
        if row is None or content_sha256 is None or row.package_content_sha256 != content_sha256:
            return None
        return self.load_results.get(row.label)

    def to_dict(self) -> dict[str, Any]:
        return {"selection": self.selection, "plan": self.plan, "rows": [asdict(r) for r in self.rows],
                "chosen": None if self.chosen is None else {"engine": self.chosen.engine,
                                                            "precision": self.chosen.precision},
                "why": self.why}


def load_gate(gates: list[Gate]) -> Gate | None:
    return next((g for g in gates if g.id == LOAD_GATE), None)


def engine_problems(cfg: ReleaseConfig, config: dict[str, Any], gates: list[Gate]) -> list[Problem]:
    """Everything wrong with `engines:` for this checkpoint, found by `relctl check` and promote's first step,
    before anything is built."""
    if not cfg.engines:
        return []
    problems: list[Problem] = []
    gate = load_gate(gates)
    if gate is None:
        problems.append(Problem("release.yaml: engines: are compared on the load gate's plan and SLOs, and "
                                "gates.load is not configured",
                                "add a gates.load block (traffic, slos, cost), or remove engines:"))
    elif cfg.convert.backend == AUTO:
        price = _gate_price(gate)
        unpriced = [e for e in cfg.engines if e.gpu_price_per_hour is None and price is None]
        if unpriced:
            problems.append(Problem(f"release.yaml: convert.backend: auto picks the cheapest engine, and "
                                    f"{_entry(unpriced[0])} has no price",
                                    "set gates.load.cost.gpu_price_per_hour (or engines[].gpu_price_per_hour)"))
    for entry in cfg.engines:
        backend = get_backend(entry.backend)
        support = backend.supports(config)
        problem = support.reason if not support.supported else backend.target_problem(
            entry.precision, cfg.convert.execution_provider) or backend.device_problem(
            config, entry.precision, cfg.convert.execution_provider)
        if problem is not None:
            problems.append(Problem(f"release.yaml: engines: {_entry(entry)}: {problem}",
                                    "remove that entry, or choose a precision it builds (relctl backends)"))
    return problems


def compare_engines(cfg: ReleaseConfig, gates: list[Gate], build: Callable[[EngineConfig], EngineBuild],
                    context: Callable[[EngineConfig, Path], GateContext], progress: Progress) -> Comparison:
    """Build and measure every entry of `engines:` (`decide` then chooses, or only tabulates).

    `build` runs the release's own stages for one entry; `context` gives the load gate's context for a
    package. A build that fails (an engine that will not start) is a rejected row, not the release's end."""
    gate = load_gate(gates)
    if gate is None:  # engine_problems refused this before any stage ran
        raise InputError("engines: needs gates.load", hint="add a gates.load block, or remove engines:")
    rows = []
    load_results: dict[str, GateResult] = {}
    for entry in cfg.engines:
        row = EngineRow(entry.backend, entry.precision)
        rows.append(row)
        try:
            built = build(entry)
        except InputError:
            raise
        except ReleaseError as exc:  # the engine could not build, validate or start: a row, with why
            row.rejected = f"could not be built or validated: {exc.message}"
            progress.note(f"engines: {row.label}: {row.rejected}")
            continue
        _quality(row, built.validation)
        row.memory_per_replica_bytes = _int((built.memory or {}).get("per_replica_bytes"))
        row.package_content_sha256 = built.content_sha256
        row.quality = built.quality
        if built.package_dir is None:
            continue
        measuring = _for_comparison(gate, entry)
        started = time.perf_counter()
        with progress.stage(f"load {row.label}"):
            result = run_gate(measuring, context(entry, built.package_dir))
        # A verdict line, marked by its outcome (a passing load test is no warning).
        progress.done(f"load {row.label}", time.perf_counter() - started, f"{result.status}: {result.reason}",
                      outcome=result.status)
        _load(row, result)
        row.limited_by = limited_by(result, built.memory)
        row.noise = repeat_noise(result)
        row.capped = capped(result)
        if entry.gpu_price_per_hour is None:  # the gate as configured (plus one repeated step): reusable
            load_results[row.label] = result
    return Comparison("auto" if cfg.convert.backend == AUTO else "fixed", rows, None, plan=_plan(gate),
                      load_results=load_results)


def decide(comparison: Comparison, cfg: ReleaseConfig) -> EngineRow | None:
    """auto: `choose` (Blocked when no row qualifies; the rows keep their reasons for the report). Otherwise
    the row of convert's own engine, if listed: the table is evidence and chooses nothing."""
    if comparison.selection == "auto":
        return choose(comparison)
    target = (cfg.convert.backend, cfg.convert.precision)
    comparison.chosen = next((r for r in comparison.rows if (r.engine, r.precision) == target), None)
    comparison.why = [f"released on convert.backend {target[0]} at {target[1]} (set in release.yaml); the table "
                      "is evidence and chose nothing (convert.backend: auto would take the cheapest)"]
    return comparison.chosen


def choose(comparison: Comparison) -> EngineRow:
    """The cheapest row that met quality and the SLOs and that no other such row dominates on cost and paired
    quality (release/pipeline/ranking.py); every other row gets its reason. Blocked when none qualifies.

    Costs within measured repeat noise, or both capped at the load test's top rate, are a tie: broken by paired
    quality, then memory per replica, never by list order while those differ. A capped load test is said on
    the chosen line, with the fix."""
    rows = comparison.rows
    for row in rows:
        if row.rejected is None and row.slo_met and row.cost_per_million_tokens is None:
            row.rejected = "no cost per million tokens (no gpu_price_per_hour, or no output tokens)"
    eligible = [r for r in rows if r.rejected is None]
    if not eligible:
        reasons = "; ".join(f"{r.label}: {r.rejected}" for r in rows)
        raise Blocked(f"engines: no engine meets quality and the SLOs ({reasons})",
                      hint="relax the SLOs or validation thresholds, add an engine or precision, or plan more "
                           "hardware; the engines table in the report has every number")
    chosen = pick(eligible)
    for row in eligible:
        if row is not chosen:
            row.rejected = why_not(row, chosen, eligible)
    comparison.chosen = chosen
    tie_rows = [r for r in eligible if r is not chosen and tied(r, chosen)]
    ties = [r.label for r in tie_rows]
    by = "paired quality, then memory per replica" if chosen.quality is not None else "memory per replica"
    named = ", ".join(ties) if len(ties) <= 2 else f"{len(ties)} others (each row says why)"
    # The chosen line says why the rows are a tie (repeat noise, or both capped at the top rate), not only that
    # they are: a reviewer reading one line must see what the measurement could not tell apart.
    because = f", {why_tied(chosen, tie_rows[0])}" if tie_rows else ""
    broken = f" (a tie with {named}{because}: broken by {by})" if ties else ""
    quality = f", paired quality {chosen.quality:+.4f}" if chosen.quality is not None else ""
    capped_line = capped_note(eligible, swept=bool(comparison.plan.get("sweep")))
    comparison.why = [f"chosen: {chosen.label}, the cheapest that met quality and the SLOs and that no other "
                      f"dominates: ${_cost(chosen):.4g} per million output tokens at {_num(chosen.rate)} req/s"
                      f"{quality}{broken}" + (f"; {capped_line}" if capped_line else ""),
                      *(f"not {r.label}: {r.rejected}" for r in rows if r is not chosen)]
    return chosen


def capped(result: GateResult) -> bool:
    """The load test never saturated the engine: no step of its sweep failed (it reached the top rate), or it
    offered one fixed rate and kept up."""
    if result.status != "pass":
        return False
    limit = result.details.get("limit")
    return limit is None or limit.get("rate") is None


def _cost(row: EngineRow) -> float:
    return float(row.cost_per_million_tokens or 0.0)


def repeat_noise(result: GateResult) -> float | None:
    """|a - b| / min(a, b) of output tok/s between the judged step and its repeat (same seeded plan)."""
    repeat = result.details.get("repeat") or {}
    pair = repeat.get("output_token_throughput") or []
    if len(pair) != 2 or min(pair) <= 0:
        return None
    return float(abs(pair[0] - pair[1]) / min(pair))


def limited_by(result: GateResult, memory: dict[str, Any] | None) -> str:
    """What stopped the engine's rate, from the sweep's first failing step: relctl's queue (429s), the
    engine's KV capacity (more sequences in flight than its plan holds, by Little's law: rate x mean E2EL),
    errors, or an SLO; "not reached" when no step failed (the engine was never saturated)."""
    limit = result.details.get("limit")
    if limit is None:
        return "the plan's offered rate (no sweep: the engine's limit was not searched)"
    rate = limit.get("rate")
    if rate is None:
        return "not reached: every step of the sweep met the SLOs (the engine was not saturated)"
    at = f"at {_num(float(rate))} req/s"
    errors: dict[str, int] = dict(limit.get("errors") or {})
    refused = errors.pop("http_429", 0)
    if refused:
        return f"queue: {refused} of {limit.get('requests')} requests refused (429) by relctl's server {at}"
    capacity = _int((memory or {}).get("max_concurrency"))
    mean_ms = _float(limit.get("e2el_mean_ms"))
    if capacity and mean_ms is not None and float(rate) * mean_ms / 1000 >= capacity:
        return (f"KV capacity: ~{float(rate) * mean_ms / 1000:.0f} sequences in flight {at}, the memory plan "
                f"holds {capacity}")
    if errors:
        return f"errors {at}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(errors.items()))
    checks = limit.get("checks") or {}
    if checks:
        return f"SLO {at}: " + "; ".join(f"{metric} {_num(_float(v[0]))} (needs {v[1]} {_num(v[2])})"
                                         for metric, v in checks.items())
    return f"SLO {at}: " + ", ".join(limit.get("failed") or ["the step failed"])


def _quality(row: EngineRow, validation: dict[str, Any]) -> None:
    metrics = validation.get("metrics", {})
    row.top1_agreement = _float(metrics.get("top1_agreement"))
    row.mean_kl = _float(metrics.get("mean_kl"))
    row.quality_passed = bool(validation.get("passed"))
    if not row.quality_passed:
        row.rejected = "quality: " + "; ".join(validation.get("failures") or ["validation failed"])


def _load(row: EngineRow, result: GateResult) -> None:
    metrics = result.metrics
    row.slo_met = result.status == "pass"
    row.rate = _float(result.details.get("sweep_best_rate") or result.details.get("rate"))
    row.ttft_p99_ms = _float(metrics.get("ttft_p99_ms"))
    row.tpot_p99_ms = _float(metrics.get("tpot_p99_ms"))
    row.output_tokens_per_s = _float(metrics.get("output_token_throughput"))
    row.cost_per_million_tokens = _float(metrics.get("cost_per_million_tokens"))
    row.cost_per_hour = _float(metrics.get("cost_per_hour"))
    row.cold_start_s = _float((result.details.get("server") or {}).get("load_time_s"))
    row.load_reason = result.reason
    if not row.slo_met and row.rejected is None:
        row.rejected = f"SLOs: {result.reason}"


def _for_comparison(gate: Gate, entry: EngineConfig) -> Gate:
    """The load gate as configured, with this engine's own accelerator price when it names one (the gate's
    cost formula, another hourly price: a GPU engine beside a CPU one) and, when it sweeps, the best step sent
    once more: the repeat noise the tie rule needs."""
    config = getattr(gate, "config", None)
    if config is None:
        return gate
    update: dict[str, Any] = {}
    if entry.gpu_price_per_hour is not None:
        update["cost"] = config.cost.model_copy(update={"gpu_price_per_hour": entry.gpu_price_per_hour})
    if getattr(config, "sweep", False) and "repeat_best" in type(config).model_fields:
        update["repeat_best"] = True
    if not update:
        return gate
    measuring: Gate = type(gate)(config.model_copy(update=update))  # type: ignore[call-arg]
    return measuring


def _gate_price(gate: Gate) -> float | None:
    cost = getattr(getattr(gate, "config", None), "cost", None)
    price = getattr(cost, "gpu_price_per_hour", None)
    return float(price) if isinstance(price, int | float) else None


def _plan(gate: Gate) -> dict[str, Any]:
    """The load plan every engine ran, as the report states it."""
    config = getattr(gate, "config", None)
    if config is None or not hasattr(config, "model_dump"):
        return {}
    dumped: dict[str, Any] = config.model_dump(mode="json")
    return {k: dumped[k] for k in ("traffic", "slos", "cost", "sweep", "sweep_rates", "step_duration_s")
            if k in dumped}


# -- the table ----------------------------------------------------------------------------------------------
HEADER = ("| engine | precision | quality vs reference (top-1 / KL) | TTFT p99 ms | TPOT p99 ms | at req/s | "
          "output tok/s | repeat noise | $ per M output tokens | memory per replica | cold start s | limited by | "
          "verdict |")


def engines_table(data: dict[str, Any]) -> list[str]:
    """The engines table (markdown lines) from a report's `engines` block."""
    chosen = data.get("chosen") or {}
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for row in data.get("rows", []):
        taken = (row["engine"], row["precision"]) == (chosen.get("engine"), chosen.get("precision"))
        quality = f"{_num(row['top1_agreement'])} / {_num(row['mean_kl'])}" + ("" if row["quality_passed"] else
                                                                               " **fail**")
        memory = size(row["memory_per_replica_bytes"]) if row["memory_per_replica_bytes"] is not None else "—"
        verdict = "**chosen**" if taken else (row["rejected"] or "—")
        noise = f"±{row['noise']:.1%}" if row.get("noise") is not None else "—"
        limit = (row.get("limited_by") or "—").replace("|", "/")
        lines.append(f"| {row['engine']} | {row['precision']} | {quality} | {_num(row['ttft_p99_ms'])} | "
                     f"{_num(row['tpot_p99_ms'])} | {_num(row['rate'])} | {_num(row['output_tokens_per_s'])} | "
                     f"{noise} | {_num(row['cost_per_million_tokens'])} | {memory} | {_num(row['cold_start_s'])} | "
                     f"{limit} | {verdict.replace('|', '/')} |")
    return lines


def engines_section(data: dict[str, Any] | None, heading: str = "## Engines side by side") -> list[str]:
    """The model card's (and job summary's) section: the plan, the table, and why the release took its engine."""
    if not data:
        return []
    traffic = data.get("plan", {}).get("traffic", {})
    swept = ", swept to the highest SLO-meeting rate" if data.get("plan", {}).get("sweep") else ""
    plan = (f"Same validation prompts and the same seeded load plan on every engine ({traffic.get('arrival')} "
            f"arrivals, {traffic.get('requests')} requests from {_num(traffic.get('rate'))} req/s, seed "
            f"{traffic.get('seed')}{swept}); latency and cost at the rate the load gate judged.")
    return [heading, plan, "", *engines_table(data), "", *(f"- {line}" for line in data.get("why", [])), "",
            *frontier_section(data.get("precision_search"))]


def _entry(entry: EngineConfig) -> str:
    return f"{entry.backend} at {entry.precision}"


def _num(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
