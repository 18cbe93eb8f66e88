"""The registered MLflow model of an onnxruntime-genai release loads with MLflow's own loaders, and register
never loads the weights to log it (the graph is serialized alone; its external data is copied beside it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from release.backends import backend_for_folder
from release.commands.api import open_registry
from release.core.errors import InputError
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


def test_the_registry_stores_the_weights_once_and_fetch_puts_the_package_back_together(
        registered: tuple[Path, str, Path], tmp_path: Path) -> None:
    """The release run's package/ leaves the weights to the MLflow model (package.links.json says where);
    fetch_package fills them in and the manifest check covers them. The artifact store holds one copy."""
    from release.registry.versions import fetch_package
    from release.signing.keys import Trust

    project, version, package = registered
    weights = (package / "model" / "model.onnx.data").stat().st_size
    artifacts = project / ".relctl" / "artifacts"
    stored = [p for p in artifacts.rglob("model.onnx.data") if p.is_file()]
    assert len(stored) == 1 and stored[0].stat().st_size == weights  # in the MLflow model, not in package/
    (links,) = artifacts.rglob("package.links.json")
    assert json.loads(links.read_text())["files"] == {"model/model.onnx.data": "model.onnx.data"}
    total = sum(p.stat().st_size for p in artifacts.rglob("*") if p.is_file())
    package_bytes = sum(p.stat().st_size for p in package.rglob("*") if p.is_file())
    assert total < 1.2 * package_bytes, (total, package_bytes)

    registry = Registry(resolve_store(project))
    fetched = fetch_package(registry, "m", version, tmp_path, trust=Trust(off=True))
    original = (package / "model" / "model.onnx.data").read_bytes()
    assert (fetched.root / "model" / "model.onnx.data").read_bytes() == original

    # The linked file is checked like any other: other bytes in the MLflow model are refused.
    stored[0].write_bytes(stored[0].read_bytes()[:-1] + b"\0")
    with pytest.raises(InputError, match="does not match its sha256"):
        fetch_package(registry, "m", version, tmp_path / "again", trust=Trust(off=True))
