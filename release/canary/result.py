"""A finished canary as a gate result: the verdict, the judge's rules as threshold checks, and the evidence
files. The canary gate (gates/canary.py) and `relctl canary` both report through it, so release/ needs
nothing from gates/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from release.canary.judge import MetricResult
from release.canary.plots import plot_checks
from release.canary.runner import CanaryResult
from release.gating.contract import GateResult, GateStatus, ThresholdCheck


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
    # The outcome prefixes the reason only where the status does not already say it (inconclusive, stopped):
    # progress and the reports print "<status>: <reason>", and "pass: pass: ..." said it twice.
    reason = result.reason if result.outcome == status else f"{result.outcome}: {result.reason}"
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
