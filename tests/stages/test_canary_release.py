"""The canary inside `relctl promote`, on the example: the registered version is `candidate` while a
real canary (two `relctl serve`s behind the router, the run's eval set as traffic) judges it.

pass -> production, previous and candidate move in one history entry; an undertrained candidate
(same shapes, same latency, worse answers) fails on output quality: candidate cleared, version tagged
rejected, production never moved.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from tests.stages.test_promote import MODEL, load_train_module, relctl
from tests.stages.test_release_defects import copy_project

pytestmark = pytest.mark.slow

# Short steps; latency bounds wide enough that two identical models never trip them on a shared machine,
# so what is judged here is the integration and output quality (the judge itself: tests/canary/).
CANARY = """
gates:
  canary:
    steps: [25, 50]
    step_requests: 40
    step_timeout_s: 30
    traffic: {rate: 25, requests: 1, output_tokens: 8, warmup: 2}
    metrics:
      ttft_ms: {allowed_relative: 3.0, allowed_absolute: 50}
      tpot_ms: {allowed_relative: 3.0, allowed_absolute: 50}
      e2el_ms: {allowed_relative: 3.0, allowed_absolute: 200}
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any, tinyllm: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("canary-release") / "project"
    project.mkdir()
    train = load_train_module()
    run1 = train.log_run(tiny_run, project, experiment=MODEL)
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: int4\n")
    first = relctl(project, "promote", run1)
    assert first.exit_code == 0, first.output + first.stderr
    second = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("run2"), replace(tiny_run.config, seed=1))
    bad = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("bad"), replace(tiny_run.config, base_steps=40,
                                                                            lora_steps=10))
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: int4\n{CANARY}")
    return {"project": project, "good": train.log_run(second, project, experiment=MODEL),
            "bad": train.log_run(bad, project, experiment=MODEL)}


def test_a_candidate_that_passes_the_canary_becomes_production(base: dict[str, Any], tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    result = relctl(project, "promote", base["good"], "--json")
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "released" and report["version"] == "2"
    canary = next(g for g in report["gates"] if g["gate"] == "canary")
    assert canary["status"] == "pass", canary["reason"]
    registry = Registry(resolve_store(project))
    assert registry.aliases(MODEL) == {"production": "2", "previous": "1"}
    moves = [(m.action, m.changes) for m in registry.history(MODEL)]
    assert moves[-2] == ("candidate", {"candidate": [None, "2"]})
    assert moves[-1] == ("canary", {"production": ["1", "2"], "previous": [None, "1"], "candidate": ["2", None]})
    assert registry.get_version(MODEL, "2").tags[T.RELEASE_STATE] == "released"
    history = relctl(project, "history", MODEL)
    v2 = "v2 (onnxruntime-genai int4)"  # every version with the engine and precision it serves on
    assert f"candidate: - -> {v2}" in history.stdout and f"candidate: {v2} -> -" in history.stdout


def test_an_undertrained_candidate_fails_on_output_quality_and_production_stays(base: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    project = copy_project(base, tmp_path)
    # fp32, so validation against its own reference passes and the canary is what judges its answers.
    result = relctl(project, "promote", base["bad"], "--precision", "fp32", "--json")
    assert result.exit_code == 1, result.output + result.stderr
    assert "gate 'canary' failed" in result.stderr and "output_quality" in result.stderr
    report = json.loads(result.stdout)
    canary = next(g for g in report["gates"] if g["gate"] == "canary")
    failed = {c["metric"].split(".")[1] for c in canary["thresholds"] if not c["passed"]}  # step-N.METRIC.rule
    assert "output_quality" in failed, canary["thresholds"]
    registry = Registry(resolve_store(project))
    assert registry.aliases(MODEL) == {"production": "1"}
    version = registry.get_version(MODEL, report["version"])
    assert version.tags[T.RELEASE_STATE] == "rejected" and "output_quality" in version.tags[T.REJECTED_REASON]
    assert [m.action for m in registry.history(MODEL)][-2:] == ["candidate", "reject"]
