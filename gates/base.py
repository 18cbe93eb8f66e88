"""What a gate plug-in needs: the contract lives in release.gating.contract, the pipeline's side of it."""

from __future__ import annotations

from release.gating.contract import (
    Gate,
    GateContext,
    GatePhase,
    GateResult,
    GateStatus,
    Problem,
    ProductionRef,
    ThresholdCheck,
    gate_phase,
    missing_file,
)

__all__ = ["Gate", "GateContext", "GatePhase", "GateResult", "GateStatus", "Problem", "ProductionRef",
           "ThresholdCheck", "gate_phase", "missing_file"]
