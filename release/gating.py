"""The bridge between the pipeline and gates/: build each gate's context, run gates, log their evidence."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import mlflow

from gates.base import GateContext, GateResult, ProductionRef
from release.pipeline import StageOutcome
from release.progress import Progress
from release.registry import PRODUCTION, Registry
from release.stages.package import PackageManifest
from release.versions import fetch_package


def production_ref(registry: Registry, name: str, dest: Path) -> ProductionRef | None:
    """The current production version with its package downloaded and checksum-verified."""
    if not registry.model_exists(name):
        return None
    mv = registry.version_for(name, PRODUCTION)
    if mv is None:
        return None
    package = fetch_package(registry, name, str(mv.version), dest)
    return ProductionRef(version=str(mv.version), package_dir=package.root, tags=dict(mv.tags))


def run_configured_gates(
    registry: Registry, gates: list[Any], name: str, package: PackageManifest, intake: StageOutcome,
    work: Path, progress: Progress, config_dir: Path | None = None,
) -> tuple[list[GateResult], ProductionRef | None]:
    """Every configured gate's result (in release.yaml order) and the production they compared with."""
    from gates.registry import run_gates

    production = production_ref(registry, name, work / "production")
    eval_data = intake.path("eval_data") if intake.outputs.get("eval_data") else None

    def context_for(gate_id: str) -> GateContext:
        gate_dir = work / "gates" / gate_id
        gate_dir.mkdir(parents=True, exist_ok=True)
        return GateContext(model_name=name, package_dir=package.root, work_dir=gate_dir,
                           production=production, eval_dataset=eval_data, config_dir=config_dir)

    results: list[GateResult] = []
    for gate in gates:
        start = time.perf_counter()
        with progress.stage(f"gate {gate.id}"):
            (result,) = run_gates([gate], context_for)
        progress.done(f"gate {result.gate}", time.perf_counter() - start, f"{result.status}: {result.reason}")
        _log_result(result)
        results.append(result)
    return results, production


def _log_result(result: GateResult) -> None:
    metrics = {f"gate.{result.gate}.{k}": float(v) for k, v in result.metrics.items()}
    if metrics:
        mlflow.log_metrics(metrics)
    mlflow.set_tag(f"gate.{result.gate}.status", result.status)
    for path in result.evidence:
        if path.is_file():
            mlflow.log_artifact(str(path), f"gates/{result.gate}")

