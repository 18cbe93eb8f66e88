"""The memory gate: the candidate package's memory plan on the configured target, computed by the package's
own engine (`Backend.plan`: each backend's formula, and where its engine runs here as planned, checked
against what the running engine reports), with production's replica (by production's engine) as the
rollout overlap when old and new share the devices, and its cold start (load time + time to first token)
against production's, measured in the same run.

Fails when the plan does not fit within the headroom, when a measured check of the plan fails, or when the
candidate's cold start exceeds max_cold_start_ratio x production's + cold_start_slack_s. The reason names
the largest concurrency that fits at the context. Evidence: memory-plan.json and the engine's own files.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from gates.base import GateContext, GateResult, ThresholdCheck
from release.backends import get_backend
from release.backends.package_facts import read_package
from release.backends.planning import GIB, Target
from release.memory.measure import ColdStart, measure_cold_starts
from release.memory.settings import MemoryConfig


class MemoryGate:
    """Blocks a candidate that cannot serve the planned load on the planned devices, or starts too slowly."""

    id: ClassVar[str] = "memory"
    Config: ClassVar[type[BaseModel]] = MemoryConfig

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config

    def run(self, context: GateContext) -> GateResult:
        cfg, work = self.config, context.work_dir
        work.mkdir(parents=True, exist_ok=True)
        facts = read_package(context.package_dir)
        backend = get_backend(facts.backend)
        target = cfg.target(facts.provider, backend.rollout_shares_devices)
        overlap = self._replaced(context, target, backend.id)
        plan = backend.plan(context.package_dir, target, settings=cfg.engine.get(backend.id), measure=True,
                            overlap_bytes=overlap)
        checks = [ThresholdCheck(c.name, c.value, c.op, c.bound, c.passed) for c in plan.checks]
        reasons = [plan.summary] + [c.reason for c in plan.checks[1:] if not c.passed and c.reason]
        details: dict[str, Any] = {"engine": backend.id, "plan": plan.to_dict(),
                                   "overlap_from": "none (surge)" if not target.rollout_overlap else
                                   "production" if overlap is not None else
                                   "candidate" if context.production is None else
                                   "production, planned as the candidate's own (the same replica)"}
        if "cold_start" in plan.details:
            details["cold_start"] = plan.details["cold_start"]
        elif cfg.cold_start and backend.cold_start_in_process:
            cold, check = self._cold_start(backend.id, facts.model_dir, context)
            details["cold_start"] = cold
            if check is not None:
                checks.append(check)
                if not check.passed:
                    reasons.append(f"cold start {check.value:.2f}x production's (bound {check.bound:g}x)")
        plan_file = work / "memory-plan.json"
        plan_file.write_text(json.dumps(details, indent=2, default=str))
        plot = backend.plot_plan(plan, work / "memory-plan.png")
        evidence = [*([plot] if plot else []), plan_file]
        metrics = {"peak_gib": plan.peak_bytes / GIB, "budget_gib": plan.budget_bytes / GIB,
                   "per_replica_gib": plan.per_replica_bytes / GIB, "kv_cache_gib": plan.kv_cache_bytes / GIB,
                   "max_concurrency": float(plan.max_concurrency), "max_context": float(plan.max_context),
                   "rollout_gpus": float(plan.rollout_devices)}
        if plan.kv_capacity_tokens is not None:
            metrics["kv_capacity_tokens"] = float(plan.kv_capacity_tokens)
        metrics.update({c.name: float(c.value) for c in plan.checks[1:]})
        metrics.update({k: float(v) for k, v in details.get("cold_start", {}).get("metrics", {}).items()})
        failed = [c for c in checks if not c.passed]
        return GateResult(self.id, "fail" if failed else "pass", "; ".join(reasons), metrics=metrics,
                          thresholds=checks, evidence=evidence, details=details)

    def _replaced(self, context: GateContext, target: Target, backend_id: str) -> int | None:
        """The replica being replaced, for a plan whose rollout shares the devices: None (the plan's own: one
        like the candidate, re-sized with each load the plan tries) unless production's replica, planned by
        its own engine (a release may change engines) at the planned load, differs from the candidate's; then
        production's bytes. One capacity for one plan: a first release and a later release of an identical
        package are the same plan (before, 1,218 vs 2,433 sequences: per rollout vs beside a fixed replica)."""
        if context.production is None or not target.rollout_overlap:
            return None
        alone = replace(target, rollout_overlap=False)
        old = read_package(context.production.package_dir)
        replaced = get_backend(old.backend).plan(context.production.package_dir, alone,
                                                 settings=self.config.engine.get(old.backend)).per_replica_bytes
        own = get_backend(backend_id).plan(context.package_dir, alone,
                                           settings=self.config.engine.get(backend_id)).per_replica_bytes
        return None if replaced == own else replaced

    def _cold_start(self, backend_id: str, model_dir: Path,
                    context: GateContext) -> tuple[dict[str, Any], ThresholdCheck | None]:
        cfg = self.config
        get_backend(backend_id).check_environment()  # e.g. two builds of a runtime would time the wrong one
        dirs = [model_dir]
        if context.production is not None:
            dirs.append(read_package(context.production.package_dir).model_dir)
        results = measure_cold_starts(dirs, repeats=cfg.cold_start_repeats)
        candidate = results[0]
        out: dict[str, Any] = {"candidate": candidate.to_dict(),
                               "metrics": {"load_s": candidate.load_s, "ttft_s": candidate.ttft_s}}
        if len(results) == 1:
            out["note"] = "no production version: measured, not judged"
            return out, None
        production: ColdStart = results[1]
        out["production"] = production.to_dict()
        ratio = candidate.total_s / production.total_s if production.total_s > 0 else float("inf")
        allowed = cfg.max_cold_start_ratio + cfg.cold_start_slack_s / max(production.total_s, 1e-9)
        out["metrics"]["cold_start_ratio"] = ratio
        out["allowed_ratio"] = allowed
        return out, ThresholdCheck("cold_start_ratio", round(ratio, 4), "<=", round(allowed, 4), ratio <= allowed)


__all__ = ["MemoryConfig", "MemoryGate"]
