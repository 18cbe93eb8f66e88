"""The gate contract. Gate authors import it as `gates.base`; the pipeline runs gates through it.

A gate is a class with
    id:      the same string as its module name, its release.yaml key and its report label
    Config:  a pydantic model (extra="forbid") for its `gates.<id>` block
    phase:   "before_register" (default: judged on the package alone) or "after_register" (needs the
             registered version, e.g. the canary, which serves it beside production)
    run(context) -> GateResult
    preflight(config_dir) -> list[Problem]   (optional) every file its block names, checked in
             milliseconds before any stage runs, so a typo is exit 2 at once, not a blocked release later
    warnings(config_dir, eval_dataset) -> list[str]   (optional) what is legal but likely wrong in the data it
             will read (`eval_dataset`: the run's eval set when it logged one), printed by `relctl check`
             and promote as warnings, never refused
and is constructed with its validated Config: `Gate(config)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel

from release.core.checks import ThresholdCheck

if TYPE_CHECKING:
    from release.backends.base import LoadedModel

# "underpowered": the gate compared, but its data could not decide at the configured margin (too few
# samples); it blocks like "fail" and is reported in its own words, never as a pass.
GateStatus = Literal["pass", "fail", "skipped", "underpowered"]
# The statuses that let a release go on; every other one, including any added later, blocks (fail closed).
NON_BLOCKING: frozenset[str] = frozenset({"pass", "skipped"})
GatePhase = Literal["before_register", "after_register"]

__all__ = ["NON_BLOCKING", "Gate", "GateContext", "GatePhase", "GateResult", "GateStatus", "Problem", "ProductionRef",
           "ThresholdCheck", "blocks", "data_warnings", "gate_phase", "missing_file", "preflight", "wants_data"]


def blocks(status: str) -> bool:
    """Whether a gate's status stops the release: fail, underpowered, and anything but pass or skipped."""
    return status not in NON_BLOCKING


@dataclass
class GateResult:
    gate: str
    status: GateStatus
    reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    thresholds: list[ThresholdCheck] = field(default_factory=list)
    evidence: list[Path] = field(default_factory=list)
    # Anything else worth keeping in the JSON report (dataset digest, sample transcripts, ...).
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProductionRef:
    """The version `production` points at when the release starts (None in GateContext when there is none)."""

    version: str
    package_dir: Path
    # The version's MLflow tags, with its LoggedModel's tags (digests such as gate.eval.dataset_sha256).
    tags: dict[str, str]
    # The newest recorded value of each of its numbers (gate.<id>.<metric>, validation.<metric>, memory.*):
    # a gate reuses production's earlier results from here instead of measuring them again.
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GateContext:
    model_name: str
    package_dir: Path          # the candidate package (verified)
    work_dir: Path             # this gate's own folder for evidence files
    production: ProductionRef | None
    # The eval set handed in by the pipeline (the run's data/eval.jsonl artifact); gates.eval.dataset wins.
    eval_dataset: Path | None = None
    # The folder of release.yaml: relative paths in a gate's block (datasets, suites, traces) mean files there.
    config_dir: Path | None = None
    # After-register gates only: the candidate's registered version.
    version: str | None = None
    # Polled by long gates (the canary) between checks: a reason to stop at once (production moved by a
    # rollback, the release was interrupted), or None to go on.
    should_stop: Callable[[], str | None] | None = None
    # The project whose registry holds `version` and production's: after-register gates that serve them
    # (the canary) serve them by registry reference, so their answers name the version that gave them.
    project_dir: Path | None = None
    # The fp32 reference this release built (the merged checkpoint in PyTorch, or the fp32 build), opened on
    # demand by a gate that compares with it; None where none was built (`relctl gate`, a replayed package).
    load_reference: Callable[[], LoadedModel] | None = None

    def resolve(self, path: Path | str) -> Path:
        """`path` from a gate's config block, relative to release.yaml's folder (not the process's cwd)."""
        p = Path(path)
        return p if p.is_absolute() or self.config_dir is None else self.config_dir / p


class Gate(Protocol):
    id: ClassVar[str]
    Config: ClassVar[type[BaseModel]]

    def run(self, context: GateContext) -> GateResult:
        """Evaluate the candidate; return pass / fail / skipped with its evidence. Never raise to block."""
        ...


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input, and how to fix it."""

    message: str
    hint: str


def missing_file(key: str, value: str | Path, config_dir: Path | None) -> Problem | None:
    """A Problem when the file a config key names does not exist (relative to release.yaml's folder)."""
    path = Path(value)
    resolved = path if path.is_absolute() or config_dir is None else config_dir / path
    if resolved.is_file():
        return None
    return Problem(f"release.yaml: {key}: file '{value}' not found (looked in {resolved.parent})",
                   f"fix the path in {key}; relative paths are relative to release.yaml's folder")


def preflight(gate: Gate, config_dir: Path | None) -> list[Problem]:
    check = getattr(gate, "preflight", None)
    return list(check(config_dir)) if check is not None else []


def data_warnings(gate: Gate, config_dir: Path | None, eval_dataset: Path | None) -> list[str]:
    """The gate's `warnings` hook, when it has one: what it finds likely wrong in its data."""
    check = getattr(gate, "warnings", None)
    return list(check(config_dir, eval_dataset)) if check is not None else []


def wants_data(gate: Gate) -> bool:
    """Whether the gate reads data for warnings (so the run's eval set is worth downloading for it)."""
    return callable(getattr(gate, "warnings", None))


def gate_phase(gate: Gate) -> GatePhase:
    """When `gate` runs; a gate that declares nothing runs before register, on the package alone."""
    phase: GatePhase = getattr(gate, "phase", "before_register")
    return phase
