"""The gate protocol: one module per gate, one pydantic Config per `gates.<id>` block in release.yaml.

A gate is a class with
    id:      the same string as its module name, its release.yaml key and its report label
    Config:  a pydantic model (extra="forbid") for its block
    run(context) -> GateResult
and is constructed with its validated Config: `Gate(config)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel

GateStatus = Literal["pass", "fail", "skipped"]


@dataclass(frozen=True)
class ThresholdCheck:
    """One metric compared with one bound; `production` is the current production's value when known."""

    metric: str
    value: float | None
    op: Literal[">=", "<=", ">", "<"]
    bound: float
    passed: bool
    kind: Literal["absolute", "min_absolute_change", "min_relative_change"] = "absolute"
    production: float | None = None


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
    # The version's MLflow tags; gates read earlier results from them (e.g. gate.eval.<metric>).
    tags: dict[str, str]


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
