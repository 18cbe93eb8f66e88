"""The canary gate: the registered candidate serves a share of live traffic beside production, through
relctl's router; the judge (release/canary/judge.py) decides per step; a failed check sets the
candidate's weight to 0 at once. The gate moves no alias: the pipeline calls
release.canary.outcome.finish_canary with its result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from gates.base import GateContext, GatePhase, GateResult, GateStatus, ThresholdCheck
from release.canary.judge import MetricResult
from release.canary.plots import plot_checks
from release.canary.runner import CanaryResult, run_canary
from release.canary.servers import served
from release.canary.settings import CanaryConfig
from release.errors import ReleaseError


class CanaryGate:
    """Production and candidate each behind `relctl serve`, the steps walked through the router."""

    id: ClassVar[str] = "canary"
    Config: ClassVar[type[BaseModel]] = CanaryConfig
    phase: ClassVar[GatePhase] = "after_register"

    def __init__(self, config: CanaryConfig) -> None:
        self.config = config

    def run(self, context: GateContext) -> GateResult:
        if context.production is None:
            return GateResult(self.id, "skipped", "no production version (first release)")
        work = context.work_dir
        work.mkdir(parents=True, exist_ok=True)
        config = _with_dataset(self.config, context)
        try:
            with served(context.production.package_dir, context.package_dir, work, config) as (prod, cand):
                result = run_canary(prod.url, cand.url, config, work, base_dir=context.config_dir,
                                    should_stop=context.should_stop)
                servers = {"production": prod.info, "candidate": cand.info}
        except ReleaseError as exc:
            return GateResult(self.id, "fail", f"canary could not run: {exc.message}",
                              evidence=sorted(work.glob("*/server.log")))
        return gate_result(self.id, result, work, {"servers": servers,
                                                   "production_version": context.production.version,
                                                   "candidate_version": context.version})


def gate_result(gate_id: str, result: CanaryResult, work: Path, extra: dict[str, Any] | None = None) -> GateResult:
    """The GateResult of a finished canary, with its evidence files written under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    tests = work / "canary-tests.json"
    tests.write_text(json.dumps(result.to_json(), indent=2))
    versions = extra or {}
    names = {side: f"v{versions[f'{side}_version']} {side}" for side in ("production", "candidate")
             if versions.get(f"{side}_version")}
    evidence = [p for p in (result.records_path, tests) if p is not None] + plot_checks(result, work / "plots", names)
    metrics: dict[str, float] = {f"{c.label}.score": c.judgement.score for c in result.checks}
    if result.rollback_s is not None:
        metrics["rollback_s"] = result.rollback_s
    if result.candidate_after_rollback is not None:
        metrics["candidate_requests_after_rollback"] = float(result.candidate_after_rollback)
    metrics.update(production_failures=float(result.production_failures), duration_s=result.duration_s,
                   checks=float(len(result.checks)))
    thresholds = [check for c in result.checks for m in c.judgement.metrics if (check := _threshold(c.label, m))]
    status: GateStatus = "pass" if result.passed else "fail"
    reason = f"{result.outcome}: {result.reason}"
    if result.rollback_s is not None and result.outcome != "pass":
        reason += f"; candidate at 0% {result.rollback_s * 1000:.2f} ms after the failed check"
    return GateResult(gate_id, status, reason, metrics=metrics, thresholds=thresholds, evidence=evidence,
                      details={**(extra or {}), **result.to_json()})


def _threshold(label: str, m: MetricResult) -> ThresholdCheck | None:
    """The judge's rule as a check: the interval's near end must not pass the allowed shift."""
    if m.interval is None or m.bound is None:
        return ThresholdCheck(f"{label}.{m.metric}", None, "<=", 0.0, False) if m.verdict != "pass" else None
    increase = m.bad == "increase"
    value = m.interval[0] if increase else m.interval[1]
    return ThresholdCheck(f"{label}.{m.metric}.shift_interval", value, "<=" if increase else ">=", m.bound,
                          m.verdict == "pass", production=m.production)


def _with_dataset(config: CanaryConfig, context: GateContext) -> CanaryConfig:
    """Without a dataset of its own the canary sends the run's eval set, so output quality is measured."""
    if config.traffic.dataset is not None:
        resolved = str(context.resolve(config.traffic.dataset))
    elif context.eval_dataset is not None and context.eval_dataset.is_file():
        resolved = str(context.eval_dataset)
    else:
        return config
    return config.model_copy(update={"traffic": config.traffic.model_copy(update={"dataset": resolved})})


__all__ = ["CanaryGate", "gate_result"]
