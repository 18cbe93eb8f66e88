"""The memory gate: the candidate package's memory plan on the configured target, by the package's engine
(onnxruntime-genai: release/memory/plan.py; vLLM: release/memory/vllm_plan.py, checked against the KV
capacity vLLM itself logs at start-up), with production's replica as the rollout overlap when old and new
share the devices, and its cold start (load time + time to first token) against production's, measured in
the same run.

Fails when the plan does not fit within the headroom, or when the candidate's cold start exceeds
max_cold_start_ratio x production's + cold_start_slack_s. The reason names the largest concurrency that
fits at the context and the precision that would fit. Evidence: memory-plan.json and memory-plan.png.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from gates.base import GateContext, GateResult, ThresholdCheck
from release.backends import get_backend
from release.memory import vllm_plan
from release.memory.gpu_env import check_ort_builds
from release.memory.measure import ColdStart, measure_cold_starts
from release.memory.package import PackageFacts, read_package
from release.memory.plan import GIB, breakdown
from release.memory.plot import plot_plan
from release.memory.settings import MemoryConfig
from release.memory.verdict import load_spec, make_plan

VLLM = "vllm"
# The plan's KV capacity against what vLLM logs at start-up (issue 19: within 5%).
KV_CAPACITY_TOLERANCE = 0.05


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
        if facts.backend == VLLM:
            return self._run_vllm(context, facts)
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

    def _run_vllm(self, context: GateContext, facts: PackageFacts) -> GateResult:
        """The vLLM plan (release/memory/vllm_plan.py); where vLLM runs here as planned (CPU), the KV capacity
        it logs at start-up must match the plan's within KV_CAPACITY_TOLERANCE, read from the server the
        offline gates already share (no extra start). Its start time is the cold start (measured, not judged:
        judging needs production's engine started too, a minute more)."""
        cfg, work = self.config, context.work_dir
        target = cfg.target(facts.provider, engine=VLLM)
        backend = get_backend(VLLM)
        spec = vllm_plan.load_spec(context.package_dir, None, target.provider)
        # Measured only where the engine here runs the planned device (CPU): a GPU plan is arithmetic.
        reported = backend.engine_memory(facts.model_dir) if target.provider == "cpu" else None
        settings = vllm_plan.VllmSettings(
            gpu_memory_utilization=cfg.gpu_memory_utilization or vllm_plan.GPU_MEMORY_UTILIZATION,
            max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs,
            kv_cache_bytes=reported.kv_cache_bytes if reported else None,
            max_model_len=reported.max_model_len if reported else None)
        overlap = None
        if context.production is not None and target.rollout_overlap:
            production = read_package(context.production.package_dir)
            if production.backend == VLLM:
                old = vllm_plan.load_spec(context.production.package_dir, None, target.provider)
                overlap = vllm_plan.breakdown(old, replace(target, rollout_overlap=False), settings).peak
            else:
                old_spec = load_spec(context.production.package_dir, None, target.provider)
                overlap = breakdown(old_spec, target, overlap_bytes=0).replica
        plan = vllm_plan.make_plan(spec, target, settings, overlap)
        b = plan.breakdown
        checks = [ThresholdCheck("kv_needed_gib", round(b.kv_needed / GIB, 3), "<=", round(b.kv_pool / GIB, 3),
                                 plan.fits)]
        details: dict[str, Any] = {"engine": VLLM, "plan": plan.to_dict(),
                                   "overlap_from": "production" if overlap else "none (surge)"}
        reasons = [plan.summary()]
        metrics = {"kv_pool_gib": b.kv_pool / GIB, "kv_needed_gib": b.kv_needed / GIB,
                   "kv_capacity_tokens": float(b.kv_capacity_tokens), "max_concurrency": float(plan.max_concurrency),
                   "max_context": float(plan.max_context), "rollout_gpus": float(plan.rollout_gpus)}
        if reported is not None:
            error = abs(plan.reported_tokens - reported.kv_cache_tokens) / max(reported.kv_cache_tokens, 1)
            details["reported"] = {"kv_cache_tokens": reported.kv_cache_tokens,
                                   "max_concurrency": reported.max_concurrency,
                                   "max_model_len": reported.max_model_len, "log_line": reported.log_line,
                                   "planned_tokens": plan.reported_tokens, "relative_error": error,
                                   # Informative: vLLM's processes' RSS beside the plan's replica (its pool is
                                   # allocated up front but pages only count once touched).
                                   "resident_bytes": reported.resident_bytes, "planned_bytes": b.peak}
            details["cold_start"] = {"candidate": {"load_s": reported.start_s},
                                     "note": "vLLM's start to ready (load included), measured, not judged"}
            metrics.update(kv_capacity_relative_error=error, vllm_kv_cache_tokens=float(reported.kv_cache_tokens),
                           load_s=reported.start_s)
            check = ThresholdCheck("kv_capacity_relative_error", round(error, 6), "<=", KV_CAPACITY_TOLERANCE,
                                   error <= KV_CAPACITY_TOLERANCE)
            checks.append(check)
            if not check.passed:
                reasons.append(f"the plan's KV capacity {plan.reported_tokens:,} tokens is {error:.1%} off what "
                               f"vLLM reports ({reported.log_line})")
        else:
            details["reported"] = {"note": f"planned for {target.provider}; vLLM here runs on cpu: not measured"}
        plan_file = work / "memory-plan.json"
        plan_file.write_text(json.dumps(details, indent=2, default=str))
        failed = [c for c in checks if not c.passed]
        return GateResult(self.id, "fail" if failed else "pass", "; ".join(reasons), metrics=metrics,
                          thresholds=checks, evidence=[plan_file], details=details)

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
