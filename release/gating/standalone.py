"""Running one gate on its own (`relctl gate <id> <package>`), outside a promote run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from release.config import config_label, load_config
from release.core.package import verify_package
from release.gating.contract import GateContext, GateResult, ProductionRef
from release.gating.plugins import find_gate, run_gate, validate_block
from release.signing.keys import trusted_keys
from release.signing.package import verify_signature


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_standalone(
    gate_id: str,
    package_dir: Path,
    work_dir: Path,
    config_path: Path | None = None,
    eval_dataset: Path | None = None,
    baseline_dir: Path | None = None,
) -> GateResult:
    """Run gate `gate_id` on the package at `package_dir` with its `gates.<id>` block from `config_path`.

    `baseline_dir` is a package that plays the production version (no-regression checks compare
    with it); `work_dir` is emptied and receives the evidence files.
    """
    config = load_config(config_path)
    cls = find_gate(gate_id, config_label(config))
    gate = cls(validate_block(cls, config.gates.get(gate_id) or {}, config_label(config)))  # type: ignore[call-arg]
    # Each package folder against its manifest, then its signature by a trusted key when it is signed (an
    # unsigned folder runs with a warning, as `relctl serve` of a folder does): a package rewritten with
    # its manifest to match is refused naming the file, before the gate loads it.
    trust = trusted_keys(config.signing, config_path.parent if config_path else Path.cwd())
    verify_package(package_dir)
    verify_signature(package_dir, trust, package_dir.name, folder=True, warn=_stderr)
    production = None
    if baseline_dir is not None:
        verify_package(baseline_dir)
        verify_signature(baseline_dir, trust, baseline_dir.name, folder=True, warn=_stderr)
        production = ProductionRef(version=f"baseline:{baseline_dir.name}", package_dir=baseline_dir, tags={})
    shutil.rmtree(work_dir, ignore_errors=True)
    context = GateContext(model_name=config.model or package_dir.name, package_dir=package_dir, work_dir=work_dir,
                          production=production, eval_dataset=eval_dataset,
                          config_dir=config_path.parent if config_path else None)
    return run_gate(gate, context)

