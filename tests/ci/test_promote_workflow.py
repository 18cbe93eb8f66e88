"""The promote workflow's own `run:` steps, run locally against the example run in a fresh repository
made by `relctl init`: the job summary holds the gate table and each exit code is named as documented.

What is not run: `uses:` actions (checkout, setup-python, cache, upload-artifact) and the step that
installs relctl — relctl is already installed in this test's virtualenv, and installing it from a git URL
needs the network. Everything else is the workflow file's text, unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from release.cli import cli
from tests.ci.local_actions import JobRun, run_job
from tests.conftest import load_train_module

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-llm"
INSTALL_STEP = "install relctl"
CHOOSE_STEP = "choose what to install"  # tests/ci/test_install_and_approve.py runs it
TOKEN = "tok-7f3a9c-never-printed"
# The example's gates (eval, safety, load), with a shorter load test.
GATES = {
    "eval": {"metrics": ["exact_match", "token_accuracy"], "thresholds": {"exact_match": {"threshold": 0.5}}},
    "safety": {"max_rate": {"harmful": 0.0}},
    "load": {"traffic": {"arrival": "poisson", "rate": 8, "requests": 12, "seed": 3, "dataset": "traffic.jsonl"},
             "slos": {"e2el_p99_ms": 20000, "max_error_rate": 0.0}},
}


def git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def contexts(run_id: str, secrets: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "inputs": {"run_id": run_id, "model": "", "project_dir": ".", "runner": "ubuntu-latest", "dry_run": False},
        "secrets": secrets or {},
        "github": {"repository": "example/models", "sha": "0" * 40, "run_id": "1", "run_attempt": "1",
                   "event": {}},
        "runner": {"os": "Linux"},
        "vars": {},
    }


def run_workflow(repo: Path, run_id: str, secrets: dict[str, str] | None = None,
                 extra_env: dict[str, str] | None = None, ctx: dict[str, Any] | None = None) -> JobRun:
    shutil.rmtree(repo / "relctl-report", ignore_errors=True)
    # relctl from this virtualenv stands in for the skipped install step.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           **(extra_env or {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    return run_job(repo / ".github/workflows/promote.yml", "promote", repo, ctx or contexts(run_id, secrets),
                   skip={CHOOSE_STEP: "relctl is already installed in the test's virtualenv",
                         INSTALL_STEP: "relctl is already installed in the test's virtualenv"}, base_env=env)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> tuple[Path, str]:
    """A fresh git repository from `relctl init`, gates enabled in its release.yaml, the example run logged."""
    repo = tmp_path_factory.mktemp("user-repo")
    git(repo, "init", "-q")
    result = CliRunner().invoke(cli, ["init", str(repo)])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((repo / "release.yaml").read_text())
    config |= {"model": "tiny-llm", "gates": GATES}
    (repo / "release.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(EXAMPLE / "traffic.jsonl", repo / "traffic.jsonl")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "relctl init")
    run_id = load_train_module().log_run(tiny_run, repo, experiment="tiny-llm", source_dir=repo)
    return repo, run_id


def test_workflow_steps_promote_the_example_run(repo: tuple[Path, str]) -> None:
    path, run_id = repo
    job = run_workflow(path, run_id)
    promote = job.step("promote")
    assert promote.status == "success", promote.log[-3000:]
    # exit code, outcome, version, model and release run: what the approve job and later steps read
    release_run = promote.outputs.pop("release_run")
    assert promote.outputs == {"exit_code": "0", "outcome": "released", "version": "1", "model": "tiny-llm"}
    assert job.step(INSTALL_STEP).status == "skipped"
    assert job.step("upload report").status == "skipped"  # an action; what it uploads is checked below
    assert "### relctl gates" in job.summary and "| Gate | Status | Reason |" in job.summary
    for gate in GATES:
        assert f"| {gate} |" in job.summary
    assert "relctl exit code 0**: released" in job.summary
    report = json.loads((path / "relctl-report/report.json").read_text())
    assert report["outcome"] == "released" and report["version"] == "1"
    assert report["release_run"] == release_run
    # The artifact folder holds the report, the log and the gates' evidence, the load gate's plots included.
    assert (path / "relctl-report/promote.log").read_text().strip()
    assert list((path / "relctl-report/gates/load").rglob("*.png"))
    assert list((path / "relctl-report/gates/eval").iterdir())


def test_blocked_release_is_exit_1_with_the_gate_table(repo: tuple[Path, str]) -> None:
    path, run_id = repo
    original = (path / "release.yaml").read_text()
    config = yaml.safe_load(original)
    config["gates"] = {"eval": {"metrics": ["exact_match"], "thresholds": {"exact_match": {"threshold": 1.01}}}}
    (path / "release.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        job = run_workflow(path, run_id)
    finally:
        (path / "release.yaml").write_text(original)
    promote = job.step("promote")
    assert promote.exit_code == 1 and promote.outputs["exit_code"] == "1", promote.log[-3000:]
    assert job.failed
    assert "| eval |" in job.summary and "relctl exit code 1**: blocked" in job.summary
    assert job.step("collect gate evidence and plots").status == "success"  # if: always()
    assert json.loads((path / "relctl-report/report.json").read_text())["outcome"] == "blocked"


def test_bad_run_id_is_exit_2_with_the_error_in_the_summary(repo: tuple[Path, str]) -> None:
    path, _ = repo
    job = run_workflow(path, "0123456789abcdef0123456789abcdef")
    promote = job.step("promote")
    assert promote.exit_code == 2 and promote.outputs["exit_code"] == "2", promote.log[-3000:]
    assert "relctl exit code 2**: bad input" in job.summary
    assert "\nerror: " in job.summary and "\nhint: " in job.summary


def test_unreachable_tracking_server_is_exit_4_and_the_token_is_never_printed(repo: tuple[Path, str]) -> None:
    path, run_id = repo
    secrets = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "MLFLOW_TRACKING_TOKEN": TOKEN}
    job = run_workflow(path, run_id, secrets, extra_env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    promote = job.step("promote")
    assert promote.exit_code == 4 and promote.outputs["exit_code"] == "4", promote.log[-3000:]
    assert "relctl exit code 4**: infrastructure" in job.summary
    printed = (job.summary + "".join(s.log for s in job.steps)).encode()
    printed += b"".join(p.read_bytes() for p in (path / "relctl-report").rglob("*") if p.is_file())
    assert TOKEN.encode() not in printed


def test_repository_dispatch_takes_the_run_and_model_from_its_payload(repo: tuple[Path, str]) -> None:
    """As `relctl webhook --github-repo` sends it: no inputs, {run_id, model, version} in client_payload."""
    path, _ = repo
    missing = "fedcba9876543210fedcba9876543210"
    ctx = contexts("")
    ctx["inputs"] = {}
    ctx["github"]["event"] = {"client_payload": {"run_id": missing, "model": "tiny-llm", "version": "7"}}
    job = run_workflow(path, "", ctx=ctx)
    promote = job.step("promote")
    assert promote.exit_code == 2, promote.log[-3000:]
    assert missing in job.summary and "relctl exit code 2**: bad input" in job.summary
