"""Register: an ONNX-servable MLflow model version with lineage tags, a model card and the package.

The package folder is logged to the release run as `package/` (what `relctl serve` and `rollback`
verify and load); the ONNX graph is logged through mlflow.onnx with a named TensorSpec signature and
explicit pip requirements, so the version also loads with mlflow.pyfunc.
"""

from __future__ import annotations

import json
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import mlflow
import mlflow.onnx
import numpy as np
import onnx
from mlflow.models.signature import ModelSignature
from mlflow.types.schema import Schema, TensorSpec

from release.hashing import sha256_json
from release.registry import Registry
from release.stages.package import MANIFEST, PackageManifest

PACKAGE_ARTIFACT = "package"
MLFLOW_TAG_MAX = 5000
CONTENT_TAG = "relctl.package_content_sha256"


def onnx_signature(model_path: Path) -> ModelSignature:
    """Named TensorSpecs for every graph input and output; symbolic dims become -1."""
    graph = onnx.load(str(model_path), load_external_data=False).graph

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        ttype = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type))
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim)
        return TensorSpec(dtype, shape, value.name)

    return ModelSignature(
        inputs=Schema([spec(v) for v in graph.input]), outputs=Schema([spec(v) for v in graph.output])
    )


def runtime_requirements() -> list[str]:
    return [f"{name}=={dist_version(name)}" for name in ("onnx", "onnxruntime", "onnxruntime-genai")]


def log_package(release_run_id: str, package: PackageManifest) -> str:
    """Upload the package folder; returns the artifact URI recorded as relctl.package_uri."""
    mlflow.log_artifacts(str(package.root), PACKAGE_ARTIFACT, run_id=release_run_id)
    return f"runs:/{release_run_id}/{PACKAGE_ARTIFACT}"


def log_onnx_model(package: PackageManifest) -> Any:
    """mlflow.onnx model of the packaged graph (must run inside the active release run)."""
    model_path = package.model_dir / "model.onnx"
    extras = [str(p) for p in sorted(package.model_dir.iterdir()) if p.is_file() and not p.name.startswith("model.onnx")]
    extras.append(str(package.root / MANIFEST))
    return mlflow.onnx.log_model(
        onnx_model=onnx.load(str(model_path)),
        name="model",
        signature=onnx_signature(model_path),
        pip_requirements=runtime_requirements(),
        extra_files=extras,
    )


def version_tags(lineage: dict[str, Any], package: PackageManifest, extra: dict[str, Any]) -> dict[str, str]:
    """Flat, searchable lineage tags; long values are kept whole in the package manifest instead."""
    training = lineage.get("training", {})
    ckpt = lineage.get("checkpoint", {})
    repo = lineage.get("release_repo", {})
    tags: dict[str, Any] = {
        "relctl.training_run_id": training.get("run_id"),
        "lineage.git_commit": training.get("git_commit"),
        "lineage.git_dirty": training.get("git_dirty"),
        "lineage.config_sha256": ckpt.get("config_sha256"),
        "lineage.release_repo_commit": repo.get("commit"),
        "lineage.release_repo_dirty": repo.get("dirty"),
        "relctl.precision": package.data.get("precision"),
        "relctl.serving_config_hash": package.serving_config_hash,
        **{f"lineage.data.{k}.sha256": v for k, v in training.get("data_sha256", {}).items()},
        **{f"lineage.weights.{k}.sha256": v for k, v in ckpt.get("weights_sha256", {}).items()},
        **{f"lineage.adapter.{k}.sha256": v for k, v in ckpt.get("adapter_sha256", {}).items()},
        **{f"relctl.exporter.{k}": v for k, v in package.data.get("exporter", {}).items()},
        **extra,
    }
    out = {}
    for key, value in tags.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        out[key] = text[:MLFLOW_TAG_MAX]
    return out


def register_version(
    registry: Registry, name: str, release_run_id: str, model_uri: str, model_id: str | None,
    tags: dict[str, str], description: str,
) -> str:
    registry.ensure_model(name, description="Served by relctl. Versions are promoted from training runs.")
    mv = registry.create_version(name, model_uri, release_run_id, tags, description, model_id=model_id)
    return str(mv.version)



def publish(registry: Registry, name: str, run_id: str, package: PackageManifest, lineage: dict[str, Any],
            extra: dict[str, Any], description: str) -> str:
    """Log the package and its ONNX model to release run `run_id` and register them as a new version."""
    package_uri = log_package(run_id, package)
    info = log_onnx_model(package)
    tags = version_tags(lineage, package, {"relctl.release_run_id": run_id, "relctl.package_uri": package_uri,
                                           CONTENT_TAG: content_sha256(package), **extra})
    return register_version(registry, name, run_id, info.model_uri, getattr(info, "model_id", None), tags,
                            description)


def content_sha256(package: PackageManifest) -> str:
    """Identity of what is served: the sha256 of every file but the manifest."""
    return sha256_json(package.files)


def register_package(registry: Registry, package: PackageManifest, name: str, experiment_id: str,
                     production: bool) -> tuple[str, str]:
    """Register a verified package on its own (`relctl register`): (version, release run id).

    Lineage tags come from the package manifest; no gate ran, which the version's tags say.
    """
    content = content_sha256(package)
    description = (f"# {name} — {package.data.get('precision')} ONNX\n\nRegistered with `relctl register` "
                   f"from a package (content sha256 `{content}`); no gate ran.")
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"register {name} from {package.root.name}") as run:
        mlflow.set_tags({"relctl.model": name, "relctl.outcome": "registered"})
        version = publish(registry, name, run.info.run_id, package, package.data.get("lineage", {}),
                          {"relctl.gates": "not run (relctl register)"}, description)
    if production:
        registry.promote(name, version, "relctl register --production", run.info.run_id)
    return version, run.info.run_id
