"""`relctl promote` end to end on the example: real training runs, real MLflow, real ONNX Runtime.

One project goes through the story of the issue: v1 to production, v2 replaces it, rollback, history;
then a precision that fails its validation thresholds is blocked and production stays where it was.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.registry import Registry
from release.store import resolve_store

MODEL = "tiny-llm"
pytestmark = pytest.mark.slow


def load_train_module() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "examples" / "tiny-llm" / "train.py"
    spec = importlib.util.spec_from_file_location("tiny_llm_train", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any, tinyllm: ModuleType) -> dict[str, Any]:
    """Two real training runs of the example, both promoted in order, in one fresh project."""
    train_module = load_train_module()
    project = tmp_path_factory.mktemp("story")
    run1 = train_module.log_run(tiny_run, project, experiment=MODEL)
    first = relctl(project, "promote", run1, "--json")
    second_result = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("run2"), replace(tiny_run.config, seed=1))
    run2 = train_module.log_run(second_result, project, experiment=MODEL)
    second = relctl(project, "promote", run2, "--json")
    return {"project": project, "runs": (run1, run2), "results": (first, second)}


def test_first_promote_registers_v1_as_production(story: dict[str, Any]) -> None:
    first = story["results"][0]
    assert first.exit_code == 0, first.output + first.stderr
    report = json.loads(first.stdout)
    assert report["outcome"] == "released" and report["version"] == "1"
    assert report["validation"]["passed"] is True
    assert report["aliases"] == {"production": [None, "1"]}
    registry = Registry(resolve_store(story["project"]))
    mv = registry.get_version(MODEL, "1")
    assert mv.tags["relctl.training_run_id"] == story["runs"][0]
    assert mv.tags["relctl.precision"] == "int4"
    assert len(mv.tags["lineage.config_sha256"]) == 64
    assert len(mv.tags["lineage.data.eval.sha256"]) == 64
    assert mv.tags["lineage.weights.model.safetensors.sha256"] == report["lineage"]["checkpoint"]["weights_sha256"][
        "model.safetensors"]
    assert mv.tags["relctl.package_uri"].endswith("/package")
    assert mv.description.startswith(f"# {MODEL} — int4 ONNX")
    assert "top1_agreement" in mv.description


def test_second_promote_moves_production_and_previous(story: dict[str, Any]) -> None:
    second = story["results"][1]
    assert second.exit_code == 0, second.output + second.stderr
    report = json.loads(second.stdout)
    assert report["version"] == "2"
    assert report["aliases"] == {"production": ["1", "2"], "previous": [None, "1"]}


def test_rollback_then_history_lists_three_moves(story: dict[str, Any]) -> None:
    project = story["project"]
    result = relctl(project, "rollback", MODEL, "--reason", "test rollback")
    assert result.exit_code == 0, result.output
    assert Registry(resolve_store(project)).aliases(MODEL) == {"production": "1"}
    history = relctl(project, "history", MODEL, "--json")
    moves = json.loads(history.stdout)
    assert [(m["action"], m["changes"]["production"]) for m in moves] == [
        ("promote", [None, "1"]), ("promote", ["1", "2"]), ("rollback", ["2", "1"])]
    assert moves[0]["release_run"] and moves[1]["release_run"] != moves[0]["release_run"]
    status = json.loads(relctl(project, "status", MODEL, "--json").stdout)
    assert status["aliases"]["production"]["training_run"] == story["runs"][0]


def test_strict_int4_is_blocked_and_production_untouched(story: dict[str, Any], tmp_path: Path) -> None:
    project = story["project"]
    registry = Registry(resolve_store(project))
    before = registry.aliases(MODEL)
    versions_before = len(registry.client.search_model_versions(f"name='{MODEL}'"))
    strict = tmp_path / "release.yaml"
    strict.write_text("convert:\n  precision: int4\nvalidation:\n  min_top1_agreement: 0.9999\n  max_mean_kl: 1.0e-9\n")
    result = relctl(project, "promote", story["runs"][1], "--config", str(strict), "--json")
    assert result.exit_code == 1, result.output + result.stderr
    error = result.stderr.strip().splitlines()[-2]
    assert error.startswith("error: validation failed: ")
    assert "top1_agreement" in error or "mean_kl" in error
    report = json.loads(result.stdout)
    assert report["outcome"] == "blocked" and report["version"] is None
    assert any("mean_kl" in f for f in report["failures"])
    assert registry.aliases(MODEL) == before
    assert len(registry.client.search_model_versions(f"name='{MODEL}'")) == versions_before
    # The attempt is still a release run holding its report.
    release_run = registry.client.get_run(report["release_run"])
    assert release_run.data.tags["relctl.outcome"] == "blocked"
    assert "report/report.json" in {a.path for a in registry.client.list_artifacts(report["release_run"], "report")}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_mlflow_ui_server_shows_aliases_tags_and_model_card(story: dict[str, Any]) -> None:
    """`mlflow server` on the same store serves what the registry UI renders: aliases, tags, card."""
    project, port = story["project"], _free_port()
    store = resolve_store(project)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store.tracking_uri,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "mlflow server did not start"
            time.sleep(0.3)
        assert "<html" in httpx.get(f"{base}/", timeout=10).text.lower()
        model = httpx.get(f"{base}/api/2.0/mlflow/registered-models/get", params={"name": MODEL}, timeout=10).json()
        aliases = {a["alias"]: a["version"] for a in model["registered_model"]["aliases"]}
        assert aliases["production"] == Registry(store).aliases(MODEL)["production"]
        version = httpx.get(f"{base}/api/2.0/mlflow/model-versions/get",
                            params={"name": MODEL, "version": "2"}, timeout=10).json()["model_version"]
        tags = {t["key"]: t["value"] for t in version["tags"]}
        assert tags["relctl.training_run_id"] == story["runs"][1]
        assert version["description"].startswith(f"# {MODEL} — int4 ONNX")
    finally:
        server.terminate()
        server.wait(timeout=30)
