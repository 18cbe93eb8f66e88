"""`precision: auto`: release the cheapest variant whose quality is non-inferior to the fp32 reference.

convert.precision: auto (or an `engines:` entry's precision: auto) asks the backend for every variant it
builds for this checkpoint on this device (`Backend.precision_variants`: its precisions for the device, and
whatever build options it offers, e.g. each quantizer method and int8 placement an installed builder lists).
The engines comparison
(release/pipeline/engines.py) then runs them, with two additions between validation and the load test:

1. each variant that passed validation (against the one shared reference, on the shared prompts) is scored
   per sample on the eval gate's rows and tested against the reference scored once (gates/precision_eval.py:
   paired non-inferiority at gates.eval.margins); an inferior or underpowered variant is refused there and
   is never load-tested (early stop);
2. when every int4 variant was refused for quality, int4 is localised (`localise`): each unit (decoder
   layer, lm_head) alone at int4 with the rest at int8, the KL it adds over the int8 build, and one retry
   with the worst units at int8.

The comparison chooses as with `convert.backend: auto` (release/pipeline/ranking.py): among the variants that
passed, the cheapest $/M output tokens at the SLO that no other passing variant dominates on cost and paired
quality; a tie on cost (within repeat noise, or both capped at the sweep's top rate) goes to the better paired
quality, then the smaller memory. The report, card and job summary carry the frontier
(release/pipeline/frontier.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from release.backends import AUTO, choose_backend, get_backend
from release.backends.variants import AUTO_PRECISION, base_precision
from release.config import EngineConfig, ReleaseConfig
from release.core.errors import ReleaseError
from release.core.progress import Progress
from release.gating.contract import Gate, GateContext, Problem
from release.gating.reference import ReferenceModel
from release.pipeline.engines import Comparison, EngineBuild, EngineRow, compare_engines, load_gate
from release.pipeline.frontier import first_difference, frontier_rows

EVAL_GATE = "eval"
# The worst units retried at int8: the fewest, largest first, that hold this share of the KL all units add.
WORST_SHARE = 0.6


class Judge(Protocol):
    """The eval gate's paired judge (gates/precision_eval.py), reached through the gate object."""

    seconds: dict[str, float]
    reference_reused: bool | None

    def reference_scores(self) -> object: ...

    def judge(self, label: str, package_dir: Path) -> dict[str, Any]: ...


@dataclass
class SearchComparison(Comparison):
    """The engines comparison of a precision search, with the paired verdicts, the int4 localisation and
    the search's cost next to the sum of its parts."""

    paired: dict[str, dict[str, Any]] = field(default_factory=dict)
    sensitivity: dict[str, Any] | None = None
    cost: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["precision_search"] = {"frontier": frontier_rows(self.rows, self.paired, self.chosen),
                                    "paired": self.paired, "sensitivity": self.sensitivity, "cost": self.cost}
        return data


def searches(cfg: ReleaseConfig) -> bool:
    return cfg.convert.precision == AUTO_PRECISION or any(e.precision == AUTO_PRECISION for e in cfg.engines)


def search_backend(cfg: ReleaseConfig, config: dict[str, Any]) -> str:
    """convert's backend for `precision: auto`: named, or auto's pick for the widest build (fp32)."""
    if cfg.convert.backend != AUTO:
        return cfg.convert.backend
    return choose_backend(config, AUTO, "fp32", cfg.convert.execution_provider).id


def expand(cfg: ReleaseConfig, config: dict[str, Any]) -> list[EngineConfig]:
    """The entries the search measures: every variant of each `auto`, listed entries as they are (once)."""
    provider = cfg.convert.execution_provider
    wanted: list[tuple[str, str, float | None]] = []
    if cfg.convert.precision == AUTO_PRECISION:
        backend = search_backend(cfg, config)
        wanted += [(backend, v, None) for v in get_backend(backend).precision_variants(config, provider)]
    for entry in cfg.engines:
        if entry.precision == AUTO_PRECISION:
            variants = get_backend(entry.backend).precision_variants(config, provider)
            wanted += [(entry.backend, v, entry.gpu_price_per_hour) for v in variants]
        else:
            wanted.append((entry.backend, entry.precision, entry.gpu_price_per_hour))
    seen: set[tuple[str, str]] = set()
    entries = []
    for backend, precision, price in wanted:
        if (backend, precision) not in seen:
            seen.add((backend, precision))
            entries.append(EngineConfig(backend=backend, precision=precision, gpu_price_per_hour=price))
    return entries


def checked_config(cfg: ReleaseConfig, config: dict[str, Any]) -> ReleaseConfig:
    """What `relctl check` checks for a search: its widest build (fp32: the memory and disk it needs, the
    backend auto takes) and every variant as an engines: entry (each one's backend must build it)."""
    if not searches(cfg):
        return cfg
    convert = cfg.convert.model_copy(update={"precision": "fp32"} if cfg.convert.precision == AUTO_PRECISION
                                     else {})
    return cfg.model_copy(update={"convert": convert, "engines": expand(cfg, config)})


def search_problems(cfg: ReleaseConfig, gates: list[Gate]) -> list[Problem]:
    """What a search needs beyond the engines comparison's own checks: the load gate with a price (it ranks by
    $/M tokens), and the eval gate with a margin per metric it tests (the paired eval)."""
    if not searches(cfg):
        return []
    problems = []
    gate = load_gate(gates)
    if gate is None:
        problems.append(Problem("release.yaml: precision: auto ranks variants by $/M output tokens under the "
                                "load gate, and gates.load is not configured",
                                "add a gates.load block (traffic, slos, cost with gpu_price_per_hour)"))
    eval_gate = next((g for g in gates if g.id == EVAL_GATE), None)
    config = getattr(eval_gate, "config", None)
    metrics = set(getattr(config, "metrics", None) or ())
    margins = [m for m in (getattr(config, "margins", None) or {}) if m in metrics]  # on the gate's own metrics
    if eval_gate is None or not hasattr(eval_gate, "paired_judge") or not margins:
        problems.append(Problem("release.yaml: precision: auto releases a variant only when its paired eval "
                                "against the fp32 reference is non-inferior, and gates.eval sets no margins on its "
                                "metrics",
                                "add gates.eval.margins, e.g. margins: {token_accuracy: 0.05}"))
    return problems


def search(cfg: ReleaseConfig, config: dict[str, Any], gates: list[Gate],
           build: Callable[[EngineConfig], EngineBuild], context: Callable[[EngineConfig, Path], GateContext],
           judge: Judge, progress: Progress) -> SearchComparison:
    """Build, validate, judge and load-test every variant (see the module docstring); `decide` then takes
    the cheapest that passed (selection is always auto: the search exists to choose)."""
    started = time.perf_counter()
    parts: dict[str, float] = {}
    paired: dict[str, dict[str, Any]] = {}

    loading: list[tuple[str, float]] = []  # the row whose load test runs since then (compare_engines runs it)

    def close_load() -> None:
        if loading:
            label, since = loading.pop()
            parts[f"load {label}"] = time.perf_counter() - since

    def timed_build(entry: EngineConfig) -> EngineBuild:
        close_load()
        begun = time.perf_counter()
        try:
            return build(entry)
        finally:
            parts[f"build {entry.backend} {entry.precision}"] = time.perf_counter() - begun

    def judged(entry: EngineConfig) -> EngineBuild:
        built = timed_build(entry)
        if built.package_dir is None:  # refused by validation: no paired eval, no load test
            return built
        label = f"{entry.backend} {entry.precision}"
        score_reference(judge, progress)
        with progress.stage(f"paired eval {label}"):
            found = paired[label] = judge.judge(label, built.package_dir)
        passed = found["outcome"] == "non_inferior"
        progress.done(f"paired eval {label}", judge.seconds.get(label, 0.0),
                      f"{found['outcome']}: {found['reason']}", outcome="pass" if passed else "fail")
        if passed:
            loading.append((label, time.perf_counter()))
            return replace(built, quality=first_difference(found))
        refused = {**built.validation, "passed": False,
                   "failures": [f"paired eval vs the fp32 reference: {found['outcome']}: {found['reason']}"]}
        return EngineBuild(refused, None, built.memory, built.content_sha256)  # early stop: no load test

    entries = expand(cfg, config)
    searched = cfg.model_copy(update={"engines": entries,
                                      "convert": cfg.convert.model_copy(update={"backend": AUTO})})
    comparison = compare_engines(searched, gates, judged, context, progress)
    close_load()
    sensitivity = None
    if int4_failed(comparison.rows):
        sensitivity = localise(comparison.rows, config, timed_build, progress)
        retry = sensitivity.get("retry")
        if retry is not None:
            again = compare_engines(searched.model_copy(update={"engines": [retry]}), gates, judged, context,
                                    progress)
            close_load()
            comparison.rows += again.rows
            comparison.load_results |= again.load_results
            sensitivity["retry"] = retry.precision
    wall = time.perf_counter() - started
    for label, seconds in judge.seconds.items():
        parts[f"paired eval {label}"] = seconds
    return SearchComparison(comparison.selection, comparison.rows, None, plan=comparison.plan,
                            load_results=comparison.load_results, paired=paired, sensitivity=sensitivity,
                            cost=cost_summary(wall, parts))


def score_reference(judge: Judge, progress: Progress) -> None:
    """The fp32 reference's eval rows, scored once (or reused from the release's cache) before the first
    paired eval, as a step of its own: the longest silent part of a search before it printed progress."""
    if judge.reference_reused is not None:
        return
    with progress.stage("reference eval"):
        judge.reference_scores()
    seconds = judge.seconds.get("reference", 0.0)
    how = "reused from this release's reference cache" if judge.reference_reused else \
        "the fp32 reference's eval rows scored once, shared by every paired eval and the eval gate"
    progress.done("reference eval", seconds, how)


def cost_summary(wall: float, parts: dict[str, float]) -> dict[str, Any]:
    """The search's wall time against its parts measured in the same run: `ratio_with_load_tests` against every
    part (builds: convert, validate, memory, package; evals: the reference scored once, each paired eval; and
    the load tests, the evaluation of cost: what is left is the search's own overhead, issue 38's goal of at
    most 1.2x), and `ratio` against the builds and evals without the load tests."""
    def total(prefixes: tuple[str, ...]) -> float:
        return sum(v for k, v in parts.items() if k.startswith(prefixes))

    builds_evals = total(("build ", "paired eval "))
    every = total(("build ", "paired eval ", "load "))
    return {"wall_s": round(wall, 3), "builds_s": round(total(("build ",)), 3),
            "evals_s": round(total(("paired eval ",)), 3), "load_tests_s": round(total(("load ",)), 3),
            "parts_s": round(builds_evals, 3), "ratio": round(wall / builds_evals, 3) if builds_evals > 0 else None,
            "ratio_with_load_tests": round(wall / every, 3) if every > 0 else None,
            "parts": {k: round(v, 3) for k, v in parts.items()}}


def int4_failed(rows: list[EngineRow]) -> bool:
    """Every int4 variant was refused for quality (validation or the paired eval), not for cost or SLOs."""
    int4 = [r for r in rows if base_precision(r.precision) == "int4"]
    return bool(int4) and all(not r.quality_passed for r in int4)


def units_of(config: dict[str, Any]) -> list[str]:
    layers = int(config.get("num_hidden_layers") or 0)
    return [*(f"layers.{i}" for i in range(layers)), "lm_head"]


def localise(rows: list[EngineRow], config: dict[str, Any], build: Callable[[EngineConfig], EngineBuild],
             progress: Progress) -> dict[str, Any]:
    """Per-unit sensitivity: the mean KL each unit adds over the int8 build when it alone is at int4; the
    retry entry puts the worst units (WORST_SHARE of the added KL, at most half the units) at int8."""
    int8 = next((r for r in rows if r.precision == "int8" and r.mean_kl is not None), None)
    engine = next(r.engine for r in rows if base_precision(r.precision) == "int4")
    backend = get_backend(engine)
    units = units_of(config)
    probe = f"int4+int4_only={units[0]}"
    if int8 is None or backend.target_problem(probe, "cpu", check_env=False) is not None:
        why = "no int8 build passed validation to compare with" if int8 is None else \
            f"{engine} cannot build one unit alone at int4"
        progress.note(f"precision: int4 failed; not localised: {why}")
        return {"skipped": why}
    added: dict[str, float] = {}
    for unit in units:
        entry = EngineConfig(backend=engine, precision=f"int4+int4_only={unit}")
        try:
            kl = (build(entry).validation.get("metrics") or {}).get("mean_kl")
        except ReleaseError as exc:
            progress.note(f"precision: sensitivity of {unit}: not measured ({exc.message})")
            continue
        if isinstance(kl, int | float) and math.isfinite(kl):
            added[unit] = max(0.0, float(kl) - float(int8.mean_kl or 0.0))
    worst = worst_units(added)
    progress.note("precision: int4 failed; KL added by each unit alone at int4: "
                  + ", ".join(f"{u} {v:.3g}" for u, v in sorted(added.items(), key=lambda kv: -kv[1]))
                  + (f"; retrying with {', '.join(worst)} at int8" if worst else ""))
    found: dict[str, Any] = {"baseline": "int8", "baseline_kl": int8.mean_kl, "added_kl": added, "worst": worst}
    if worst:
        found["retry"] = EngineConfig(backend=engine, precision="int4+int8=" + ",".join(worst))
    return found


def worst_units(added: dict[str, float]) -> list[str]:
    """The fewest units, largest added KL first, that together hold WORST_SHARE of all the KL added (at most
    half of them, at least one); none when no unit adds any."""
    total = sum(added.values())
    if total <= 0:
        return []
    chosen: list[str] = []
    held = 0.0
    for unit, value in sorted(added.items(), key=lambda kv: -kv[1]):
        if held >= WORST_SHARE * total or len(chosen) >= max(1, len(added) // 2):
            break
        chosen.append(unit)
        held += value
    return chosen


def measure(cfg: ReleaseConfig, gates: list[Gate], build: Callable[[EngineConfig], EngineBuild],
            context: Callable[[EngineConfig, Path], GateContext], progress: Progress, checkpoint: Path,
            judging: GateContext, reference_cache: Path | None = None) -> Comparison:
    """The engines comparison, or under `precision: auto` the search (promote's one call). `judging` is the
    eval gate's context (its eval set, release.yaml's folder); the reference is the merged checkpoint in
    PyTorch at fp32, the one validation's reference is computed from, scored once per release: kept in
    `reference_cache` by content digest (release/gating/reference.py), where the eval gate finds it."""
    if not searches(cfg):
        return compare_engines(cfg, gates, build, context, progress)
    from release.backends.torch_reference import TorchReference  # noqa: PLC0415 - loads torch
    from release.core.checkpoint import read_config  # noqa: PLC0415

    eval_gate: Any = next(g for g in gates if g.id == EVAL_GATE)  # search_problems refused a search without it
    judge: Judge = eval_gate.paired_judge(judging, ReferenceModel(checkpoint, TorchReference, reference_cache))
    return search(cfg, read_config(checkpoint), gates, build, context, judge, progress)
