"""The release defects of the architecture issue, each on a real promote of the tiny example.

One module fixture builds a project once: v1 (int4) and v2 (fp32) released, and an int8 candidate
built with --dry-run. Each test works on its own copy of that project (the SQLite store and the stage
folders travel with it), so the tests run in any order and alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from tests.registry.test_crash_and_race import RELCTL, kill_when_paused, relctl_process
from tests.stages.test_promote import MODEL, load_train_module, relctl

pytestmark = pytest.mark.slow

# A canary gate (it is paused or stopped before its servers start in these tests).
CANARY = "gates:\n  canary:\n    steps: [50]\n    step_requests: 20\n    traffic: {rate: 20, requests: 1}\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("defects") / "project"
    project.mkdir()
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: int4\n")
    run = load_train_module().log_run(tiny_run, project, experiment=MODEL)
    for args in (["promote", run], ["promote", run, "--precision", "fp32"],
                 ["promote", run, "--precision", "int8", "--dry-run"]):
        result = relctl(project, *args)
        assert result.exit_code == 0, result.output + result.stderr
    return {"project": project, "run": run}


def copy_project(base: dict[str, Any], tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(base["project"], project)
    return project


def versions(project: Path) -> list[str]:
    registry = Registry(resolve_store(project))
    return sorted((str(v.version) for v in registry.client.search_model_versions(f"name='{MODEL}'")), key=int)


def test_a_missing_load_dataset_is_bad_input_before_any_stage(base: dict[str, Any], tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    (project / "release.yaml").write_text(
        "convert:\n  precision: int8\ngates:\n  load:\n    traffic: {rate: 4, requests: 4, dataset: nope.jsonl}\n"
        "  safety:\n    suite: missing-suite.jsonl\n")
    work_before = sorted(p.name for p in (project / ".relctl" / "work").rglob("*"))
    started = time.monotonic()
    result = relctl(project, "promote", base["run"])
    assert result.exit_code == 2, result.output + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    # Every problem at once, each with its fix, and no stage ran.
    assert any("gates.load.traffic.dataset" in e and "nope.jsonl" in e for e in errors), errors
    assert any("gates.safety.suite" in e for e in errors), errors
    assert sum(line.startswith("hint: ") for line in result.stderr.splitlines()) == len(errors)
    assert time.monotonic() - started < 20
    assert sorted(p.name for p in (project / ".relctl" / "work").rglob("*")) == work_before
    assert versions(project) == ["1", "2"]


def test_a_memory_plan_that_does_not_fit_blocks(base: dict[str, Any], tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    (project / "release.yaml").write_text("convert:\n  precision: int8\nserving:\n  gpu_memory_gib: 0.0001\n")
    result = relctl(project, "promote", base["run"], "--json")
    assert result.exit_code == 1, result.output + result.stderr
    assert "memory plan does not fit" in result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "blocked" and report["version"] is None
    assert report["memory"]["fits"] is False and report["memory"]["weights_bytes"] > 0
    assert report["memory"]["kv_cache_bytes"] > 0 and report["memory"]["max_concurrency"] == 0
    assert versions(project) == ["1", "2"]


def test_changing_the_server_queue_re_runs_neither_validation_nor_memory(base: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    (project / "release.yaml").write_text("convert:\n  precision: int8\nserving:\n  server:\n    queue_size: 3\n")
    result = relctl(project, "promote", base["run"], "--dry-run", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    stages = json.loads(result.stdout)["stages"]
    assert stages["validate"]["resumed"] and stages["memory"]["resumed"]
    assert not stages["package"]["resumed"]  # the serving config is part of the package


def test_a_register_killed_after_creating_the_version_is_finished_by_the_re_run(base: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    marker = tmp_path / "paused"
    kill_when_paused(relctl_process(project, "promote", base["run"], "--precision", "int8",
                                    pause_at="register:version-created", marker=marker), marker, timeout=300)
    registry = Registry(resolve_store(project))
    assert versions(project) == ["1", "2", "3"]
    assert registry.get_version(MODEL, "3").tags[T.RELEASE_STATE] == "registering"
    assert registry.aliases(MODEL)["production"] == "2"
    result = relctl(project, "promote", base["run"], "--precision", "int8", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    assert "did not finish; finishing it" in result.stderr
    assert json.loads(result.stdout)["version"] == "3"
    assert versions(project) == ["1", "2", "3"]                     # no twin
    assert registry.aliases(MODEL) == {"production": "3", "previous": "2"}
    assert registry.get_version(MODEL, "3").tags[T.RELEASE_STATE] == "released"
    promotes = [m for m in registry.history(MODEL) if m.action == "promote"]
    assert [m.changes["production"] for m in promotes] == [[None, "1"], ["1", "2"], ["2", "3"]]
    # The killed attempt's release run is not left RUNNING.
    runs = registry.client.search_runs([registry.releases_experiment()], "attributes.status = 'KILLED'")
    assert len(runs) == 1 and runs[0].data.tags[T.OUTCOME] == "killed"


def test_a_rollback_during_the_gates_wins_and_the_promote_says_why(base: dict[str, Any], tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    marker = tmp_path / "paused"
    proc = relctl_process(project, "promote", base["run"], "--precision", "int8", "--json",
                          pause_at="register:before", marker=marker)
    deadline = time.monotonic() + 300
    while not marker.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    rollback = relctl(project, "rollback", MODEL, "--reason", "incident")
    assert rollback.exit_code == 0, rollback.output + rollback.stderr
    marker.unlink()  # the promote goes on to register
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 4, out + err
    assert "production moved from v2 to v1 while the gates ran" in err
    report = json.loads(out)
    assert report["outcome"] == "error" and report["exit_code"] == 4
    assert any("production moved" in f for f in report["failures"])
    registry = Registry(resolve_store(project))
    assert registry.aliases(MODEL)["production"] == "1"
    assert [m.action for m in registry.history(MODEL)][-1] == "rollback"


def test_two_promotes_of_one_run_at_once_keep_one_release_in_flight(base: dict[str, Any], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    project = copy_project(base, tmp_path)
    marker = tmp_path / "paused"
    args = ("promote", base["run"], "--precision", "int8", "--json")
    first = relctl_process(project, *args, pause_at="register:version-created", marker=marker)
    wait_paused(first, marker)
    registry = Registry(resolve_store(project))
    assert versions(project) == ["1", "2", "3"]
    # A webhook redelivery with a short deadline: it waits, says so, gives up naming the first; touches nothing.
    monkeypatch.setenv("RELCTL_PROMOTE_WAIT_S", "3")
    second = relctl_process(project, *args)
    _out, err = second.communicate(timeout=120)
    assert second.returncode == 4, err
    assert "another promote of run" in err and "waiting for it to finish" in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "still in flight" in errors[0] and f"pid {first.pid} " in errors[0], err
    assert registry.get_version(MODEL, "3").tags[T.RELEASE_STATE] == "registering"
    assert registry.aliases(MODEL) == {"production": "2", "previous": "1"}
    # A CI retry that waits: it joins once the first is done, and never finishes the first's version.
    monkeypatch.delenv("RELCTL_PROMOTE_WAIT_S")
    log = tmp_path / "retry.err"
    with log.open("w") as err_file:
        retry = subprocess.Popen([*RELCTL, "--project-dir", str(project), *args], text=True,
                                 stdout=subprocess.PIPE, stderr=err_file, env=relctl_env())
    deadline = time.monotonic() + 120
    while "waiting for it to finish" not in log.read_text():
        assert retry.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    marker.unlink()
    out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0 and json.loads(out1)["version"] == "3", err1
    out2, _ = retry.communicate(timeout=300)
    err2 = log.read_text()
    assert retry.returncode == 0, out2 + err2
    assert "waiting for it to finish" in err2 and "did not finish; finishing it" not in err2
    assert json.loads(out2)["outcome"] == "unchanged" and json.loads(out2)["version"] == "3"
    assert versions(project) == ["1", "2", "3"]
    assert registry.aliases(MODEL) == {"production": "3", "previous": "2"}
    assert [m.changes["production"] for m in registry.history(MODEL) if m.action == "promote"][-1] == ["2", "3"]
    assert len([m for m in registry.history(MODEL) if m.action == "promote"]) == 3


def relctl_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def wait_paused(proc: subprocess.Popen[str], marker: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not marker.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_sigterm_during_the_canary_unwinds_the_registered_version(base: dict[str, Any], tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: int4\n{CANARY}")
    marker = tmp_path / "paused"
    proc = relctl_process(project, "promote", base["run"], "--precision", "int8", "--json",
                          pause_at="canary:running", marker=marker)
    wait_paused(proc, marker)
    registry = Registry(resolve_store(project))
    assert registry.aliases(MODEL)["candidate"] == "3"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert "nothing was registered" not in err and "v3 was registered" in err, err
    tags = registry.get_version(MODEL, "3").tags
    assert tags[T.RELEASE_STATE] == "stopped" and tags["gate.canary.status"] == "stopped"
    assert registry.aliases(MODEL) == {"production": "2", "previous": "1"}
    assert registry.history(MODEL)[-1].action == "canary-stopped"
    # It never passed its canary: production may not point at it without the explicit override.
    refused = relctl(project, "rollback", MODEL, "--to", "3")
    assert refused.exit_code == 2 and "it is stopped" in refused.stderr, refused.stderr
