"""The promote workflow's install choice and its approve job: their `run:` steps run locally (local_actions.py).

- An empty RELCTL_SOURCE in a user's repository stops with exit 2 before anything is installed (it used to
  install the user's own repository as relctl); in relctl's own repository it installs the checkout.
- A GPU run installs CUDA torch and relctl's [gpu] extras, one ONNX Runtime build.
- The approve job (after GitHub's environment protection let it run) approves the version waiting for it,
  naming the reviewer, and production moves.
The pip installs themselves are not run (no network here): what they would install is what is checked.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from release.commands.init import starter_texts
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.signing.keys import KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV
from tests.ci.local_actions import JobRun, run_job
from tests.signing.test_signing import MODEL, _keypair, _package

REPO = Path(__file__).resolve().parents[2]
CHOOSE, INSTALL = "choose what to install", "install relctl"
SOURCE = "git+https://github.com/acme/relctl@v0.1.0"


def contexts(**inputs: Any) -> dict[str, Any]:
    return {"inputs": {"run_id": "r1", "model": "", "project_dir": ".", "runner": "", "dry_run": False, **inputs},
            "secrets": {}, "github": {"repository": "acme/models", "sha": "0" * 40, "run_id": "7", "run_attempt": "1",
                                      "event": {}, "token": "t"},
            "runner": {"os": "Linux"}, "vars": {}, "needs": {}}


def workflow(repo: Path, source: str | None) -> Path:
    """The workflow as `relctl init` writes it: RELCTL_SOURCE filled in when relctl knows where it came from."""
    path = repo / ".github/workflows/promote.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(starter_texts(source)[".github/workflows/promote.yml"])
    return path


def env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV, "RELCTL_USER",
                                                            "MLFLOW_TRACKING_URI")}
    return {**base, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base['PATH']}"}


def choose(repo: Path, source: str | None, **inputs: Any) -> JobRun:
    # Only the choice runs: the install, the promote and the actions are what it feeds.
    return run_job(workflow(repo, source), "promote", repo, contexts(**inputs), base_env=env(),
                   skip={INSTALL: "no network", "promote": "not this test's subject"})


def test_an_empty_relctl_source_in_a_users_repository_stops_before_installing(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "acme-models"\n')  # the user's own project
    job = choose(tmp_path, None)
    step = job.step(CHOOSE)
    assert (step.status, step.exit_code) == ("failure", 2)
    lines = step.log.strip().splitlines()
    assert lines[0] == ("error: RELCTL_SOURCE is empty in .github/workflows/promote.yml, and acme/models is not "
                        "relctl")
    assert lines[1].startswith("hint: set RELCTL_SOURCE")
    assert job.step(INSTALL).status == "skipped"


def test_an_empty_relctl_source_in_relctls_own_repository_installs_the_checkout(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    step = choose(tmp_path, None).step(CHOOSE)
    assert step.status == "success", step.log
    assert f"installs: relctl[models] from file://{tmp_path}; torch from https://download.pytorch.org/whl/cpu" \
        in step.log


def test_a_gpu_runner_installs_cuda_torch_and_the_gpu_extras(tmp_path: Path) -> None:
    cpu = choose(tmp_path, SOURCE, runner="gpu-a100").step(CHOOSE)
    assert f"installs: relctl[models] from {SOURCE}; torch from https://download.pytorch.org/whl/cpu" in cpu.log
    gpu = choose(tmp_path, SOURCE, runner="gpu-a100", gpu=True).step(CHOOSE)
    assert gpu.status == "success", gpu.log
    assert f"installs: relctl[models,gpu] from {SOURCE}; torch from https://download.pytorch.org/whl/cu126" in gpu.log
    # The install replaces the CPU builds the base dependencies pull with the CUDA ones, then checks there is
    # one build of each (release/backends/onnxruntime_genai/gpu_env.py refuses a mixed environment).
    wf = yaml.safe_load((REPO / "templates/github-promote.yml").read_text())
    install = next(s for s in wf["jobs"]["promote"]["steps"] if s.get("name") == INSTALL)["run"]
    assert "pip uninstall -y onnxruntime onnxruntime-genai" in install
    assert '--force-reinstall --no-deps "onnxruntime-gpu==$ort" "onnxruntime-genai-cuda==$genai"' in install
    assert "python -m release.backends.onnxruntime_genai.gpu_env" in install
    # A repository_dispatch asks for a GPU the same way (client_payload.gpu).
    ctx = contexts()
    ctx["inputs"] = {}
    ctx["github"]["event"] = {"client_payload": {"run_id": "r", "gpu": True}}
    step = run_job(workflow(tmp_path, SOURCE), "promote", tmp_path, ctx, base_env=env(),
                   skip={INSTALL: "no network", "promote": "not this test"}).step(CHOOSE)
    assert "installs: relctl[models,gpu]" in step.log


def test_the_approve_job_approves_the_waiting_version_naming_the_reviewer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "repo"
    project.mkdir()
    keys = tmp_path / "keys"
    keys.mkdir()
    private, public = _keypair(keys, "release")
    (project / "release.yaml").write_text(f"signing:\n  trusted_keys: [{public}]\n")
    for name in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV):
        monkeypatch.delenv(name, raising=False)
    from release.commands import api

    monkeypatch.setenv(KEY_ENV, str(private))
    version, _ = api.register(_package(tmp_path, 1), MODEL, project)
    monkeypatch.delenv(KEY_ENV)
    registry = Registry(resolve_store(project))
    # As a promote under require_approval leaves it (tests/signing/test_approval.py makes one for real).
    registry.set_version_tags(MODEL, version, {T.RELEASE_STATE: "awaiting-approval", T.GATED_AGAINST: ""})
    ctx = contexts()
    ctx["needs"] = {"promote": {"outputs": {"outcome": "awaiting-approval", "version": version, "model": MODEL}}}
    ctx["secrets"] = {"RELCTL_SIGNING_KEY": private.read_text()}
    ctx["github"]["actor"] = "octocat"
    job = run_job(workflow(project, SOURCE), "approve", project, ctx, base_env={**env(), "GITHUB_ACTOR": "octocat"},
                  skip={INSTALL: "no network"})
    step = job.step("approve")
    assert step.status == "success", step.log
    # No approvals API here (no gh, no network): the actor who started the run is named.
    assert f"{MODEL} v{version} approved by github:octocat ($RELCTL_USER)" in step.log
    assert registry.aliases(MODEL) == {"production": version}
    last = registry.history(MODEL)[-1]
    assert (last.action, last.user) == ("approve", "github:octocat")
    assert "approved in GitHub environment relctl-release (workflow run 7)" in last.reason
    assert registry.get_version(MODEL, version).tags[T.APPROVAL_SIGNATURE]  # signed with the environment's key
