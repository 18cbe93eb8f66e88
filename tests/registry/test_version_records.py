"""What a model version carries: only the documented tags, its numbers as metrics of its LoggedModel (newest
value wins after a re-gate), and what versions registered before that (numbers as tags) still give."""

from __future__ import annotations

from pathlib import Path

import mlflow
import mlflow.onnx
import numpy as np
import onnx
import pytest
from mlflow.entities.model_registry import ModelVersion
from onnx import TensorProto, helper

from release.registry import Registry
from release.registry import tags as T
from release.registry.client import logged_model_id
from release.registry.store import connect, ensure_experiment, resolve_store

MODEL = "records"


def _identity_onnx(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _version(project_dir: Path, tmp_path: Path, tags: dict[str, str] | None = None,
             legacy: dict[str, str] | None = None) -> tuple[Registry, ModelVersion, str]:
    """A version whose source is an mlflow.onnx LoggedModel of a real release run, as publish() makes it."""
    store = resolve_store(project_dir)
    connect(store)
    registry = Registry(store)
    mlflow.set_experiment(experiment_id=ensure_experiment(store, "releases"))
    with mlflow.start_run() as run:
        info = mlflow.onnx.log_model(onnx.load(str(_identity_onnx(tmp_path / "m.onnx"))), name="model",
                                     pip_requirements=["onnx"], input_example=np.zeros(1, dtype=np.float32))
    registry.ensure_model(MODEL, "test")
    mv = registry.create_version(MODEL, info.model_uri, run.info.run_id, {T.RELEASE_RUN: run.info.run_id,
                                                                         **(tags or {})}, "card")
    for key, value in (legacy or {}).items():  # written as relctl before schema 3 did: raw client, as tags
        registry.client.set_model_version_tag(MODEL, mv.version, key, value)
    return registry, registry.get_version(MODEL, str(mv.version)), run.info.run_id


def test_an_undocumented_version_tag_is_refused_before_anything_is_written(project_dir: Path,
                                                                           tmp_path: Path) -> None:
    registry, mv, _ = _version(project_dir, tmp_path, {T.gate_status("eval"): "pass"})
    with pytest.raises(ValueError, match=r"not a documented model-version tag: gate\.eval\.exact_match"):
        registry.set_version_tags(MODEL, mv.version, {T.REJECTED_REASON: "x", "gate.eval.exact_match": "0.9"})
    assert T.REJECTED_REASON not in registry.get_version(MODEL, mv.version).tags  # all or nothing
    with pytest.raises(ValueError, match=r"lineage\.data\.eval\.sha256"):
        registry.create_version(MODEL, mv.source, mv.run_id, {"lineage.data.eval.sha256": "ab"}, "x")
    assert len(registry.client.search_model_versions(f"name='{MODEL}'")) == 1
    assert T.is_version_tag("gate.my_plugin.status") and not T.is_version_tag("gate.eval.status.extra")


def test_numbers_are_logged_model_metrics_and_a_re_gate_logs_newer_ones(project_dir: Path, tmp_path: Path) -> None:
    registry, mv, run_id = _version(project_dir, tmp_path)
    registry.record_numbers(mv, run_id, {"gate.eval.exact_match": 0.8, "validation.mean_kl": 0.01,
                                         "gate.load.bad": float("nan")}, {"gate.eval.dataset_sha256": "d" * 64})
    logged = registry.client.get_logged_model(logged_model_id(mv))
    assert {m.key: m.value for m in logged.metrics} == {"gate.eval.exact_match": 0.8, "validation.mean_kl": 0.01}
    assert logged.tags["gate.eval.dataset_sha256"] == "d" * 64
    assert not [k for k in registry.get_version(MODEL, mv.version).tags if k.startswith(("gate.eval.e", "valid"))]
    # A later release run re-gates the same version: its values are the newest.
    mlflow.set_experiment(experiment_id=ensure_experiment(registry.store, "releases"))
    with mlflow.start_run() as later:
        pass
    registry.record_numbers(mv, later.info.run_id, {"gate.eval.exact_match": 0.9}, {})
    metrics, details = registry.recorded_numbers(mv)
    assert metrics == {"gate.eval.exact_match": 0.9, "validation.mean_kl": 0.01}
    assert details == {"gate.eval.dataset_sha256": "d" * 64}


def test_a_version_from_before_schema_3_still_gives_its_numbers(project_dir: Path, tmp_path: Path) -> None:
    legacy = {"gate.eval.exact_match": "0.75", "gate.eval.dataset_sha256": "e" * 64, "validation.top1": "0.99",
              "lineage.data.eval.sha256": "1" * 64, "gate.eval.status": "pass"}
    registry, mv, _ = _version(project_dir, tmp_path, legacy=legacy)
    metrics, details = registry.recorded_numbers(mv)
    assert metrics == {"gate.eval.exact_match": 0.75, "validation.top1": 0.99}
    assert details == {"gate.eval.dataset_sha256": "e" * 64}
