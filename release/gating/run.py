"""The pipeline's side of gates: build each gate's context, run the gates of a phase, log their evidence."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from release.faults import pause_point
from release.gating.contract import Gate, GateContext, GatePhase, GateResult, ProductionRef, gate_phase
from release.gating.plugins import run_gate
from release.progress import Progress
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.runs import ReleaseRun
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


def gates_of_phase(gates: list[Gate], phase: GatePhase) -> list[Gate]:
    return [g for g in gates if gate_phase(g) == phase]


def run_phase_gates(
    gates: list[Gate], context_for: Callable[[str], GateContext], progress: Progress, run: ReleaseRun | None,
) -> list[GateResult]:
    """Each gate in release.yaml order with its own context; results logged to the release run."""
    results: list[GateResult] = []
    for gate in gates:
        start = time.perf_counter()
        pause_point(f"gate:{gate.id}")
        with progress.stage(f"gate {gate.id}"):
            result = run_gate(gate, context_for(gate.id))
        progress.done(f"gate {result.gate}", time.perf_counter() - start, f"{result.status}: {result.reason}")
        if run is not None:
            log_result(run, result)
        results.append(result)
    return results


def log_result(run: ReleaseRun, result: GateResult) -> None:
    run.log_metrics({T.gate_metric(result.gate, k): float(v) for k, v in result.metrics.items()})
    run.set_tags({T.gate_status(result.gate): result.status})
    for path in result.evidence:
        if path.is_file():
            run.log_artifact(path, f"gates/{result.gate}")
