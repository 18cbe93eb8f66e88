"""Aliases, relctl's alias history and rollback, on a real MLflow SQLite store and real packages."""

from __future__ import annotations

import functools
import json
from itertools import pairwise
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner

from release.backends import backend_for_folder
from release.cli import cli
from release.commands import api
from release.core.errors import InputError
from release.core.hashing import sha256_file
from release.core.package import MANIFEST, build_package
from release.registry import Registry, links
from release.registry import tags as T
from release.registry.store import connect, ensure_experiment, resolve_store
from release.registry.transitions import promote
from release.signing.keys import project_signing_key
from release.signing.package import sign_package

MODEL = "demo-model"


def _register(project_dir: Path, tmp: Path, n: int, precision: str = "fp32") -> str:
    """A registered version whose package is a real relctl package logged to a real MLflow run."""
    runtime, source = tmp / f"rt{n}", tmp / f"src{n}"
    runtime.mkdir()
    source.mkdir()
    (runtime / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "n": n}}))
    (runtime / "model.onnx").write_bytes(bytes([n]) * 128)
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    backend = backend_for_folder(runtime)
    package = build_package(tmp / f"pkg{n}", runtime, source, {"model_name": MODEL, "precision": precision},
                            backend)
    store = resolve_store(project_dir)
    connect(store)
    registry = Registry(store)
    mlflow.set_experiment(experiment_id=ensure_experiment(store, "releases"))
    with mlflow.start_run() as run:
        # Signed as promote signs (the project's release key, from the session's keys): serve and rollback
        # verify every version, and the provenance binds it to this release run.
        key = project_signing_key(project_dir)
        if key is not None:
            sign_package(package.root, key, {"model": MODEL, "release_run": run.info.run_id})
        mlflow.log_artifacts(str(package.root), "package")
    registry.ensure_model(MODEL, "test")
    # The package is found as `package/` of the release run the version names.
    tags = {T.RELEASE_RUN: run.info.run_id, T.MANIFEST_SHA256: sha256_file(package.root / MANIFEST),
            T.BACKEND: backend.id, T.PRECISION: precision}
    mv = registry.create_version(MODEL, run.info.artifact_uri + "/package", run.info.run_id, tags, f"v{n}")
    promote(registry, MODEL, str(mv.version), f"release {n}", run.info.run_id)
    return str(mv.version)


def test_promote_rollback_history(project_dir: Path, tmp_path: Path) -> None:
    v1 = _register(project_dir, tmp_path, 1)
    registry = Registry(resolve_store(project_dir))
    assert registry.aliases(MODEL) == {"production": v1}
    v2 = _register(project_dir, tmp_path, 2, precision="int4")
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}

    runner = CliRunner()
    result = runner.invoke(cli, ["--project-dir", str(project_dir), "rollback", MODEL, "--reason", "p99 regression"])
    assert result.exit_code == 0, result.output
    # The engine and precision each side serves on: a rollback across engines or precisions is never silent.
    assert f"production v{v2} (onnxruntime-genai int4) -> v{v1} (onnxruntime-genai fp32)" in result.output

    text = runner.invoke(cli, ["--project-dir", str(project_dir), "history", MODEL])
    assert f"production: v{v2} (onnxruntime-genai int4) -> v{v1} (onnxruntime-genai fp32)" in text.output
    status = runner.invoke(cli, ["--project-dir", str(project_dir), "status", MODEL])
    assert f"{MODEL}@production: v{v1} (onnxruntime-genai fp32) from run" in status.output
    # v1 replaced nothing, so after going back to it there is no `previous`.
    assert registry.aliases(MODEL) == {"production": v1}

    result = runner.invoke(cli, ["--project-dir", str(project_dir), "history", MODEL, "--json"])
    assert result.exit_code == 0, result.output
    moves = json.loads(result.output)
    assert [m["action"] for m in moves] == ["promote", "promote", "rollback"]
    assert moves[0]["changes"] == {"production": [None, v1]}
    assert moves[1]["changes"] == {"production": [v1, v2], "previous": [None, v1]}
    assert moves[2]["changes"] == {"production": [v2, v1], "previous": [v1, None]}
    assert moves[2]["reason"] == "p99 regression"
    assert moves[2]["engines"] == {v1: "onnxruntime-genai fp32", v2: "onnxruntime-genai int4"}
    assert all(m["at"] <= n["at"] for m, n in pairwise(moves))
    # The registered model's page (its description) shows the same history as a table, newest first.
    page = registry.client.get_registered_model(MODEL).description
    aliases = page.split("## Aliases", 1)[1].split("## Alias history", 1)[0]
    # Links are relative to the UI on the embedded store and absolute behind a tracking server (tests/scale).
    link = functools.partial(links.version_link, registry.store.tracking_uri, MODEL)
    assert f"| `production` | [v{v1}]({link(v1)}) |" in aliases and "previous" not in aliases
    rows = [line for line in page.split("## Alias history", 1)[1].splitlines() if line.startswith("| 2")]
    assert [row.split(" | ")[1] for row in rows] == ["rollback", "promote", "promote"]
    assert f"`production` [v{v2}]({link(v2)}) → [v{v1}]" in rows[0] and "p99 regression" in rows[0]


def test_rollback_without_previous_is_bad_input(project_dir: Path, tmp_path: Path) -> None:
    _register(project_dir, tmp_path, 1)
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", MODEL])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"error: {MODEL}: no 'previous' alias, so there is nothing to roll back to"


def test_rollback_refuses_a_tampered_package(project_dir: Path, tmp_path: Path) -> None:
    v1 = _register(project_dir, tmp_path, 1)
    v2 = _register(project_dir, tmp_path, 2)
    registry = Registry(resolve_store(project_dir))
    run_id = registry.get_version(MODEL, v1).run_id
    root = Path(registry.client.get_run(run_id).info.artifact_uri.removeprefix("file://"))
    artifact = root / "package/model/model.onnx"
    artifact.write_bytes(b"tampered")
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", MODEL])
    assert result.exit_code == 2
    assert "model/model.onnx does not match its sha256" in result.stderr
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}


def test_status_and_unknown_model(project_dir: Path, tmp_path: Path) -> None:
    v1 = _register(project_dir, tmp_path, 1)
    data = api.status(MODEL, project_dir)
    assert data["aliases"]["production"]["version"] == v1
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "status", "nope"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: registered model 'nope' not found")
    with pytest.raises(InputError, match="registered model 'nope' not found"):
        api.history("nope", project_dir)
