"""relctl's own records of what the registry holds: every read of a run or a model version outside
release/registry/ sees these, never an MLflow entity, so nothing else depends on MLflow's object model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from release.registry.tags import DATASET_CONTEXT


@dataclass(frozen=True)
class RunRecord:
    """A tracking run: its ids, name, state, artifact root and its tags, params and latest metrics."""

    run_id: str
    experiment_id: str
    run_name: str
    status: str
    artifact_uri: str
    start_time: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # The datasets logged as run inputs: name, digest and context (training, eval, ...).
    datasets: list[dict[str, str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class VersionRecord:
    """A registered model version. `version` is the number as text ("3"), as aliases and tags name it."""

    name: str
    version: str
    tags: dict[str, str] = field(default_factory=dict)
    source: str = ""
    run_id: str | None = None
    creation_timestamp: int | None = None
    description: str = ""
    model_id: str | None = None
    aliases: list[str] = field(default_factory=list)   # filled by a single-version read, not by a search


@dataclass(frozen=True)
class ModelRecord:
    """A registered model: its aliases (alias -> version) and its tags (the alias history lives there)."""

    name: str
    aliases: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def model_record(model: Any) -> ModelRecord:
    return ModelRecord(name=str(model.name), aliases={a: str(v) for a, v in (model.aliases or {}).items()},
                       tags=dict(model.tags or {}))


def run_record(run: Any) -> RunRecord:
    info, data = run.info, run.data
    datasets = []
    for dataset_input in run.inputs.dataset_inputs if run.inputs else []:
        ds = dataset_input.dataset
        context = next((t.value for t in dataset_input.tags if t.key == DATASET_CONTEXT), None)
        datasets.append({"name": ds.name, "digest": ds.digest, "context": context})
    return RunRecord(run_id=str(info.run_id), experiment_id=str(info.experiment_id), run_name=str(info.run_name or ""),
                     status=str(info.status), artifact_uri=str(info.artifact_uri or ""), start_time=info.start_time,
                     tags=dict(data.tags), params=dict(data.params), metrics=dict(data.metrics), datasets=datasets)


def version_record(mv: Any) -> VersionRecord:
    return VersionRecord(name=str(mv.name), version=str(mv.version), tags=dict(mv.tags or {}),
                         source=str(mv.source or ""), run_id=mv.run_id, creation_timestamp=mv.creation_timestamp,
                         description=str(mv.description or ""), model_id=getattr(mv, "model_id", None),
                         aliases=[str(a) for a in (getattr(mv, "aliases", None) or [])])
