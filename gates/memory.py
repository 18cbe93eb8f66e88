"""The memory gate: the candidate package's memory plan on the configured target (release/memory/plan.py),
with production's replica as the rollout overlap when there is one, and its cold start (load time + time
to first token) against production's, measured in the same run.

Fails when the plan does not fit within the headroom, or when the candidate's cold start exceeds
max_cold_start_ratio x production's + cold_start_slack_s. The reason names the largest concurrency that
fits at the context and the precision that would fit. Evidence: memory-plan.json and memory-plan.png.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from gates.base import GateContext, GateResult, ThresholdCheck
from release.memory.gpu_env import check_ort_builds
from release.memory.measure import ColdStart, measure_cold_starts
from release.memory.package import read_package
from release.memory.plan import GIB, breakdown
from release.memory.plot import plot_plan
from release.memory.settings import MemoryConfig
from release.memory.verdict import load_spec, make_plan


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
        target = cfg.target(facts.provider)
        spec = load_spec(context.package_dir, None, target.provider)
        overlap = None
        if context.production is not None and target.rollout_overlap:
            production = load_spec(context.production.package_dir, None, target.provider)
            overlap = breakdown(production, target, overlap_bytes=0).replica
        plan = make_plan(spec, target, overlap)
        checks = [ThresholdCheck("peak_gib", round(plan.breakdown.peak / GIB, 3), "<=",
                                 round(plan.breakdown.budget / GIB, 3), plan.fits)]
        details: dict[str, Any] = {"plan": plan.to_dict(), "overlap_from": "production" if overlap else "candidate"}
        reasons = [plan.summary()]
        if cfg.cold_start:
            cold, check = self._cold_start(facts.model_dir, context)
            details["cold_start"] = cold
            if check is not None:
                checks.append(check)
                if not check.passed:
                    reasons.append(f"cold start {check.value:.2f}x production's (bound {check.bound:g}x)")
        plan_file = work / "memory-plan.json"
        plan_file.write_text(json.dumps(details, indent=2, default=str))
        evidence = [plot_plan(plan, work / "memory-plan.png", overlap), plan_file]
        metrics = {"peak_gib": plan.breakdown.peak / GIB, "budget_gib": plan.breakdown.budget / GIB,
                   "max_concurrency": float(plan.max_concurrency), "max_context": float(plan.max_context)}
        metrics.update({k: float(v) for k, v in details.get("cold_start", {}).get("metrics", {}).items()})
        failed = [c for c in checks if not c.passed]
        return GateResult(self.id, "fail" if failed else "pass", "; ".join(reasons), metrics=metrics,
                          thresholds=checks, evidence=evidence, details=details)

    def _cold_start(self, model_dir: Path, context: GateContext) -> tuple[dict[str, Any], ThresholdCheck | None]:
        cfg = self.config
        check_ort_builds()  # two ORT builds in one environment would time the wrong runtime
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
