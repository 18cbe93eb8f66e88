"""The pipeline's side of gates: build each gate's context, run the gates of a phase, log their evidence."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from release.core.faults import pause_point
from release.core.progress import Progress
from release.gating.contract import Gate, GateContext, GatePhase, GateResult, ProductionRef, gate_phase
from release.gating.plugins import run_gate
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.runs import ReleaseRun
from release.registry.versions import fetch_package
from release.signing.keys import Trust

PLOTS_ARTIFACT = "plots"


def production_ref(registry: Registry, name: str, dest: Path, trust: Trust) -> ProductionRef | None:
    """The current production version with its package downloaded, checksum- and signature-verified."""
    if not registry.model_exists(name):
        return None
    mv = registry.version_for(name, PRODUCTION)
    if mv is None:
        return None
    package = fetch_package(registry, name, str(mv.version), dest, trust=trust)
    metrics, details = registry.recorded_numbers(mv)
    return ProductionRef(version=str(mv.version), package_dir=package.root, tags={**details, **mv.tags},
                         metrics=metrics)


def gates_of_phase(gates: list[Gate], phase: GatePhase) -> list[Gate]:
    return [g for g in gates if gate_phase(g) == phase]


def run_phase_gates(
    gates: list[Gate], context_for: Callable[[str], GateContext], progress: Progress, run: ReleaseRun | None,
    measured: dict[str, GateResult] | None = None, keep_going: bool = False,
) -> list[GateResult]:
    """Each gate in release.yaml order with its own context; results logged to the release run. `measured`:
    results this release already has for some gates on this very package (the engines comparison's load
    test of the engine it releases), taken as they are instead of run again.

    After the first failed gate the later ones do not run (a blocked release need not pay for a load test):
    each is recorded as skipped, naming the gate that failed; `keep_going` runs them all (every verdict in
    one report)."""
    results: list[GateResult] = []
    for gate in gates:
        failed = next((r for r in results if r.status == "fail"), None)
        if failed is not None and not keep_going:
            result = not_run(gate.id, failed.gate)
            progress.done(f"gate {gate.id}", 0.0, f"{result.status}: {result.reason}", outcome=result.status)
            if run is not None:
                log_result(run, result)
            results.append(result)
            continue
        if measured and gate.id in measured:
            result = measured[gate.id]
            progress.done(f"gate {result.gate}", 0.0, f"{result.status}: {result.reason} (measured in the "
                                                      "engines comparison on this package, not run again)",
                          outcome=result.status)
            if run is not None:
                log_result(run, result)
            results.append(result)
            continue
        start = time.perf_counter()
        pause_point(f"gate:{gate.id}")
        with progress.stage(f"gate {gate.id}"):
            result = run_gate(gate, context_for(gate.id))
        progress.done(f"gate {result.gate}", time.perf_counter() - start, f"{result.status}: {result.reason}",
                      outcome=result.status)
        if run is not None:
            log_result(run, result)
        results.append(result)
    return results


def not_run(gate_id: str, failed_gate: str) -> GateResult:
    """The record of a gate left out because an earlier one failed."""
    return GateResult(gate=gate_id, status="skipped",
                      reason=f"not run: gate '{failed_gate}' failed first (promote --keep-going runs every gate)")


def log_result(run: ReleaseRun, result: GateResult, metrics: bool = True) -> None:
    """Status tag, metrics (unless the caller records them itself) and evidence: plots under `plots/`, where
    the model card links them, everything else under `gates/<id>/`."""
    if metrics:
        run.log_metrics({T.gate_metric(result.gate, k): float(v) for k, v in result.metrics.items()})
    run.set_tags({T.gate_status(result.gate): result.status})
    plots = {path: PurePosixPath(artifact) for _, (path, artifact) in plot_artifacts(result).items()}
    with tempfile.TemporaryDirectory() as tmp:
        for path in result.evidence:
            if path in plots:  # under its artifact name: two gates may both draw a latency-cdf.png
                named = Path(tmp) / plots[path].name
                shutil.copyfile(path, named)
                run.log_artifact(named, str(plots[path].parent))
            elif path.is_file():
                run.log_artifact(path, f"gates/{result.gate}")


def plot_artifacts(result: GateResult) -> dict[str, tuple[Path, str]]:
    """{title: (local file, artifact path)} of the PNGs among a gate's evidence, named `plots/<gate>-<file>`."""
    out: dict[str, tuple[Path, str]] = {}
    for path in result.evidence:
        if path.suffix.lower() == ".png" and path.is_file():
            title = f"{result.gate}: {path.stem.replace('-', ' ').replace('_', ' ')}"
            out[title] = (path, f"{PLOTS_ARTIFACT}/{result.gate}-{path.name}")
    return out
