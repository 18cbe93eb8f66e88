"""The registered MLflow model of an onnxruntime-genai release loads with MLflow's own loaders, and register
never loads the weights to log it (the graph is serialized alone; its external data is copied beside it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from release.backends import backend_for_folder
from release.commands.api import open_registry
from release.core.package import build_package, verify_package
from release.registry import Registry
from release.registry.store import connect, resolve_store
from release.stages.convert import convert
from release.stages.register import register_package


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory, tiny_base_only: Path) -> tuple[Path, str, Path]:
    root = tmp_path_factory.mktemp("registered-model")
    converted = convert(tiny_base_only, root / "onnx", "fp32")
    assert (converted.out_dir / "model.onnx.data").is_file()  # the weights live outside the graph
    package = build_package(root / "package", converted.out_dir, tiny_base_only,
                            {"model_name": "m", "precision": "fp32", "serving": {}},
                            backend_for_folder(converted.out_dir))
    project = root / "project"
    project.mkdir()
    registry = open_registry(project)
    version, _ = register_package(registry, verify_package(package.root), "m", production=False)
    return project, version, package.root


def test_the_version_loads_with_mlflow_onnx_and_pyfunc(registered: tuple[Path, str, Path], tmp_path: Path) -> None:
    import mlflow.pyfunc

    project, version, package = registered
    connect(resolve_store(project))
    uri = f"models:/m/{version}"
    local = Registry(resolve_store(project)).download_uri(uri, tmp_path / "model")
    loaded = onnx.load(str(local / "model.onnx"))  # external data resolved from the model's own artifacts
    original = onnx.load(str(package / "model" / "model.onnx"))
    ours = {t.name: onnx.numpy_helper.to_array(t) for t in original.graph.initializer}
    theirs = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours)
    # pyfunc builds an ONNX Runtime session over the logged folder: it fails if model.onnx.data is missing.
    model = mlflow.pyfunc.load_model(uri)
    assert {i.name for i in model.metadata.get_input_schema().inputs} >= {"input_ids", "attention_mask"}


def test_the_logged_graph_is_not_rewritten(registered: tuple[Path, str, Path], tmp_path: Path) -> None:
    """The weights file is the package's own, byte for byte (copied, never re-serialized)."""
    project, version, package = registered
    registry = Registry(resolve_store(project))
    mv = registry.get_version("m", version)
    local = registry.download_uri(mv.source, tmp_path / "model")
    assert (local / "model.onnx.data").read_bytes() == (package / "model" / "model.onnx.data").read_bytes()
    shutil.rmtree(local)
