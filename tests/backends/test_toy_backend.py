"""A third backend from a test-only distribution releases the example end to end.

tests/backends/toy_backend is a separate distribution (`relctl-toy-backend`) with one Backend subclass and
one `relctl.backends` entry point: PyTorch eager serving the merged checkpoint. It is pip-installed into a
temporary folder that only these subprocesses see, so relctl finds it exactly as a team's own engine
package would be found, with no line of relctl naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from release.registry import Registry
from release.registry.store import resolve_store
from release.registry.versions import fetch_package
from release.signing.keys import Trust
from tests.conftest import load_train_module

pytestmark = pytest.mark.slow

TOY = Path(__file__).resolve().parent / "toy_backend"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"
MODEL = "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))  # the console script of this environment


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment in which the toy distribution is installed (on PYTHONPATH, with its dist-info)."""
    root = tmp_path_factory.mktemp("toy")
    source = root / "src"
    shutil.copytree(TOY, source)  # building writes into the source folder: never into the repository
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True)
    assert list(site.glob("relctl_toy_backend-*.dist-info"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def relctl(project: Path, env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELCTL, "--project-dir", str(project), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any, toy_env: dict[str, str]) -> dict[str, Any]:
    """The example's release.yaml (eval, safety, memory and load gates) with the toy backend at fp32."""
    project = tmp_path_factory.mktemp("toy-project")
    config = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    config["convert"] = {"backend": "torch-eager", "precision": "fp32"}
    config["gates"].pop("canary")  # needs a production version to compare with; the first release has none
    (project / "release.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(EXAMPLE / "traffic.jsonl", project / "traffic.jsonl")
    run_id = load_train_module().log_run(tiny_run, project, experiment=MODEL)
    check = relctl(project, toy_env, "check", run_id)
    promote = relctl(project, toy_env, "promote", run_id, "--json")
    return {"project": project, "run": run_id, "check": check, "promote": promote}


def test_the_backend_is_found_through_its_entry_point(toy_env: dict[str, str], tmp_path: Path) -> None:
    listed = relctl(tmp_path, toy_env, "backends", "--json")
    assert listed.returncode == 0, listed.stderr
    found = {b["id"]: b for b in json.loads(listed.stdout)}
    assert found["torch-eager"]["precisions"] == ["fp32"] and "onnxruntime-genai" in found
    # Without the distribution installed, relctl does not know it.
    alone = relctl(tmp_path, dict(os.environ), "backends", "--json")
    assert "torch-eager" not in {b["id"] for b in json.loads(alone.stdout)}


def test_promote_releases_through_the_toy_backend_with_every_gate(released: dict[str, Any]) -> None:
    assert released["check"].returncode == 0, released["check"].stderr
    promote = released["promote"]
    assert promote.returncode == 0, promote.stderr
    report = json.loads(promote.stdout)
    assert report["outcome"] == "released" and report["version"] == "1"
    # fp32 torch against the fp32 torch reference: validation is exact.
    assert report["validation"]["passed"] and report["validation"]["metrics"]["top1_agreement"] == 1.0
    statuses = {g["gate"]: g["status"] for g in report["gates"]}
    assert statuses == {"eval": "pass", "safety": "pass", "memory": "pass", "load": "pass"}, report["gates"]


def test_the_package_names_its_backend_and_holds_no_onnx(released: dict[str, Any], tmp_path: Path) -> None:
    registry = Registry(resolve_store(released["project"]))
    mv = registry.version_for(MODEL, "production")
    assert mv is not None
    package = fetch_package(registry, MODEL, str(mv.version), tmp_path, trust=Trust(off=True))  # the registry digest
    manifest = package.data
    assert package.backend_id == "torch-eager"
    assert manifest["backend"]["id"] == "torch-eager" and manifest["backend"]["version"] == "0.1.0"
    assert "model/model.safetensors" in manifest["files"]
    assert not any(name.endswith(".onnx") for name in manifest["files"])
    # The registered MLflow model carries the runtime files under a `relctl` flavour naming the backend.
    model = registry.download_uri(str(mv.source), tmp_path / "m")
    mlmodel = yaml.safe_load((model / "MLmodel").read_text())
    assert mlmodel["flavors"]["relctl"]["backend"] == "torch-eager"
    assert (model / "model.safetensors").stat().st_size == (package.model_dir / "model.safetensors").stat().st_size


def test_relctl_serve_starts_the_toy_engine_and_needs_it_installed(released: dict[str, Any],
                                                                   toy_env: dict[str, str], tmp_path: Path) -> None:
    project = released["project"]
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([RELCTL, "--project-dir", str(project), "serve",
                             f"{MODEL}@production", "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)],
                            env=toy_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.is_file() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.2"], check=True)
        assert ready.is_file(), proc.stderr.read() if proc.stderr else ""
        url = json.loads(ready.read_text())["url"]
        answer = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "reverse b d a f ->",
                                                           "max_tokens": 8, "temperature": 0}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-relctl-version"] == "1"
        assert answer.json()["choices"][0]["text"].strip().startswith("f a d b")
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["batching"]["mode"] == "threads"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # The same version where the toy backend is not installed: refused, naming the backend, exit 2. (Without
    # the project's release.yaml, which names the backend too: the package's manifest is what refuses here.)
    (project / "release.yaml").rename(project / "release.yaml.aside")
    try:
        missing = relctl(project, dict(os.environ), "serve", f"{MODEL}@production", "--port", "0", timeout=120)
    finally:
        (project / "release.yaml.aside").rename(project / "release.yaml")
    assert missing.returncode == 2, missing.stderr
    assert "backend 'torch-eager' is not installed" in missing.stderr
