"""The canary gate and `relctl canary MODEL` on real parts: tiny ONNX packages behind `relctl serve`,
MLflow on SQLite, the outcome moved into the aliases (and the history) in one entry."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gates.base import GateContext, ProductionRef
from gates.canary import CanaryGate
from release.canary.outcome import REJECTED_TAG, finish_canary, start_canary
from release.canary.result import gate_result
from release.canary.runner import CanaryResult
from release.canary.settings import CanaryConfig
from release.cli import cli
from release.commands.api import history, open_registry, register
from release.registry import CANDIDATE, PREVIOUS, PRODUCTION

QUICK = {"steps": [50], "step_requests": 40, "step_timeout_s": 60,
         "traffic": {"rate": 15, "requests": 1, "output_tokens": 8, "warmup": 2}}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two packages of one tiny random Llama that differ only in their serving block (two versions)."""
    from release.backends import backend_for_folder
    from release.core.package import build_package
    from tests.serving.tinymodel import build_genai, build_hf_model

    root = tmp_path_factory.mktemp("canary-packages")
    hf = build_hf_model(root / "hf")
    genai = build_genai(hf, root / "genai")
    out = []
    for i, serving in enumerate(({}, {"server": {"workers": 2}})):
        fields = {"model_name": "tiny-llm", "precision": "fp32", "exporter": {"name": "onnxruntime-genai"},
                  "lineage": {"run_id": f"test-{i}"}, "serving": serving}
        build_package(root / f"package-{i}", genai, hf, fields, backend_for_folder(genai))
        out.append(root / f"package-{i}")
    return out[0], out[1]


def test_first_release_is_skipped(tmp_path: Path) -> None:
    gate = CanaryGate(CanaryConfig())
    result = gate.run(GateContext("tiny-llm", tmp_path / "candidate", tmp_path, production=None))
    assert result.status == "skipped" and result.reason == "no production version (first release)"
    assert CanaryGate.phase == "after_register" and CanaryGate.id == "canary"


@pytest.mark.slow
def test_gate_on_real_servers_passes_an_identical_candidate(tmp_path: Path, packages: tuple[Path, Path]) -> None:
    prod, cand = packages
    gate = CanaryGate(CanaryConfig.model_validate(QUICK))
    result = gate.run(GateContext("tiny-llm", cand, tmp_path, production=ProductionRef("1", prod, {}), version="2"))
    assert result.status == "pass", result.reason
    records = [json.loads(line) for line in (tmp_path / "router-records.jsonl").read_text().splitlines()]
    failures = [(r["status"], r["error"], r["output_tokens"]) for r in records if r["status"] != "ok"]
    assert result.metrics["step-1.score"] >= 0.75 and result.metrics["production_failures"] == 0, failures
    names = {p.name for p in result.evidence}
    assert {"router-records.jsonl", "canary-tests.json", "latency-cdf-step-1.png"} <= names
    tests = json.loads((tmp_path / "canary-tests.json").read_text())
    assert tests["checks"][0]["metrics"][0]["test"] == "mann-whitney"
    assert any(t.metric == "step-1.error_rate.shift_interval" for t in result.thresholds)
    # relctl serve's version headers reached the records through the router.
    assert {r["backend"] for r in records} == {"production", "candidate"}
    assert all(r["model"] and r["model"].startswith("tiny-llm") for r in records if r["status"] == "ok")


@pytest.mark.slow
def test_model_mode_moves_aliases_in_one_entry(tmp_path: Path, packages: tuple[Path, Path]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    v1, _ = register(packages[0], "tiny-llm", project, production=True)
    v2, _ = register(packages[1], "tiny-llm", project)
    args = ["--project-dir", str(project), "canary", "tiny-llm", "--version", v2, "--steps", "50",
            "--step-requests", "40", "--rate", "15", "--json", "--out", str(tmp_path / "out")]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["alias_move"]["changes"] == {PRODUCTION: [v1, v2], PREVIOUS: [None, v1], CANDIDATE: [v2, None]}
    registry = open_registry(project)
    assert registry.aliases("tiny-llm") == {PRODUCTION: v2, PREVIOUS: v1}
    actions = [m.action for m in history("tiny-llm", project)]
    assert actions[-2:] == ["canary-start", "canary"]
    # Served by registry reference: every answer names the registered version that gave it.
    records_file = next(Path(p) for p in report["evidence"] if p.endswith("router-records.jsonl"))
    records = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert {(r["backend"], r["model"], r["version"]) for r in records} == {("production", "tiny-llm", v1),
                                                                           ("candidate", "tiny-llm", v2)}


def test_failed_canary_rejects_and_a_rollback_during_one_wins(tmp_path: Path, packages: tuple[Path, Path]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    v1, _ = register(packages[0], "tiny-llm", project, production=True)
    v2, _ = register(packages[1], "tiny-llm", project)
    registry = open_registry(project)
    start_canary(registry, "tiny-llm", v2)
    failed = CanaryResult("fail", "step 1 (10%): critical metric failed: error_rate", [], False, rollback_s=1e-5)
    # The pipeline hands over the gate's result, as the gate returned it.
    move = finish_canary(registry, "tiny-llm", v2, v1, gate_result("canary", failed, tmp_path / "gate"))
    assert move is not None and move.changes == {CANDIDATE: [v2, None]}
    assert registry.aliases("tiny-llm") == {PRODUCTION: v1}
    rejected = registry.get_version("tiny-llm", v2).tags
    assert "error_rate" in rejected[REJECTED_TAG] and rejected["gate.canary.status"] == "fail"
    assert rejected["relctl.release_state"] == "rejected"
    # v3 under canary; meanwhile an operator moves production: the canary's pass must not override it.
    v3, _ = register(shutil.copytree(packages[1], tmp_path / "p3"), "tiny-llm", project)
    start_canary(registry, "tiny-llm", v3)
    # (v2 was rejected: only the explicit override, `rollback --to 2 --allow-unreleased`, may serve it.)
    registry.locked_move("tiny-llm", lambda _current: {PRODUCTION: v2}, "rollback", "operator", None, override=True)
    finish_canary(registry, "tiny-llm", v3, v1, CanaryResult("pass", "1 steps passed", [], False))
    assert registry.aliases("tiny-llm") == {PRODUCTION: v2}
    assert [m.action for m in history("tiny-llm", project)][-2:] == ["rollback", "canary-stopped"]
