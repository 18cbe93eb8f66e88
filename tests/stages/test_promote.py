"""`relctl promote` end to end on the example: real training runs, real MLflow, real ONNX Runtime.

One project goes through the story of the issue: v1 to production, v2 replaces it, rollback, history;
then a precision that fails its validation thresholds is blocked and production stays where it was.
"""

from __future__ import annotations

import json
import os
import shutil
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
from tests.conftest import load_train_module

MODEL = "tiny-llm"
pytestmark = pytest.mark.slow


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any, tinyllm: ModuleType) -> dict[str, Any]:
    """Two real training runs of the example, both promoted in order, in one fresh project."""
    train_module = load_train_module()
    project = tmp_path_factory.mktemp("story")
    # The example's own release.yaml (int4, validation thresholds, eval, safety and load gates) and the
    # load gate's traffic file beside it.
    for name in ("release.yaml", "traffic.jsonl"):
        shutil.copy(EXAMPLE / name, project / name)
    run1 = train_module.log_run(tiny_run, project, experiment=MODEL)
    first = relctl(project, "promote", run1, "--json")
    second_result = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("run2"), replace(tiny_run.config, seed=1))
    run2 = train_module.log_run(second_result, project, experiment=MODEL)
    second = relctl(project, "promote", run2, "--json")
    # The rollback is part of the story, not of one test, so every test sees the same state in any order.
    rollback = relctl(project, "rollback", MODEL, "--reason", "test rollback")
    aliases_after_rollback = Registry(resolve_store(project)).aliases(MODEL)
    history = relctl(project, "history", MODEL, "--json")
    status = relctl(project, "status", MODEL, "--json")
    return {"project": project, "runs": (run1, run2), "results": (first, second),
            "rollback": (rollback, aliases_after_rollback, history, status)}


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
    # Gates ran before registration and are summarized on the version.
    assert [(g["gate"], g["status"]) for g in report["gates"]] == [("eval", "pass"), ("safety", "pass"),
                                                                   ("load", "pass"), ("canary", "skipped")]
    assert report["gates"][3]["reason"] == "no production version (first release)"
    load = report["gates"][2]
    assert load["metrics"]["error_rate"] == 0.0 and load["metrics"]["cost_per_million_tokens"] > 0
    assert mv.tags["gate.eval.status"] == "pass" and mv.tags["gate.safety.status"] == "pass"
    assert float(mv.tags["gate.eval.exact_match"]) >= 0.8
    assert "## Gates" in mv.description and "report/report.html" in mv.description


def test_second_promote_moves_production_and_previous(story: dict[str, Any]) -> None:
    second = story["results"][1]
    assert second.exit_code == 0, second.output + second.stderr
    report = json.loads(second.stdout)
    assert report["version"] == "2"
    # The example's release.yaml has a canary: v2 was `candidate` until it passed, then one move did it all.
    assert report["aliases"] == {"production": ["1", "2"], "previous": [None, "1"], "candidate": ["2", None]}
    assert next(g for g in report["gates"] if g["gate"] == "canary")["status"] == "pass"


def test_rollback_then_history_lists_three_moves(story: dict[str, Any]) -> None:
    result, aliases, history, status_result = story["rollback"]
    assert result.exit_code == 0, result.output
    assert aliases == {"production": "1"}
    moves = json.loads(history.stdout)
    assert [(m["action"], m["changes"].get("production")) for m in moves] == [
        ("promote", [None, "1"]), ("candidate", None), ("canary", ["1", "2"]), ("rollback", ["2", "1"])]
    assert moves[1]["changes"] == {"candidate": [None, "2"]} and moves[2]["changes"]["candidate"] == ["2", None]
    assert moves[0]["release_run"] and moves[2]["release_run"] != moves[0]["release_run"]
    status = json.loads(status_result.stdout)
    assert status["aliases"]["production"]["training_run"] == story["runs"][0]


def test_re_promoting_what_already_serves_records_the_new_evidence(story: dict[str, Any]) -> None:
    project = story["project"]
    registry = Registry(resolve_store(project))
    before = (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'")))
    moves_before = len(registry.history(MODEL))
    assert before[0]["production"] == "1"  # after the rollback: run 1's package serves
    result = relctl(project, "promote", story["runs"][0], "--json")
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    assert (report["outcome"], report["version"]) == ("re-gated", "1")
    assert "already serves this package" in result.stderr
    after = (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'")))
    assert after == before  # no alias moved, no twin version
    history = registry.history(MODEL)
    assert len(history) == moves_before + 1 and history[-1].action == "re-gated" and history[-1].changes == {}
    assert history[-1].release_run == report["release_run"]
    tags = registry.get_version(MODEL, "1").tags
    assert tags["gate.eval.status"] == "pass" and tags["gate.load.status"] == "pass"
    assert report["release_run"] in registry.get_version(MODEL, "1").description


def test_a_promote_without_gates_says_so_everywhere(story: dict[str, Any], tmp_path: Path) -> None:
    empty = tmp_path / "release.yaml"
    empty.write_text("convert:\n  precision: int4\n")
    summary = tmp_path / "summary.md"
    result = relctl(story["project"], "promote", story["runs"][1], "--config", str(empty), "--dry-run", "--json",
                    "--summary", str(summary))
    assert result.exit_code == 0, result.output + result.stderr
    assert "released without gates" in result.stderr
    report = json.loads(result.stdout)
    assert any("released without gates" in n for n in report["notes"])
    assert "released without gates" in summary.read_text()
    registry = Registry(resolve_store(story["project"]))
    card = Path(registry.client.download_artifacts(report["release_run"], "report/model_card.md")).read_text()
    assert "released without gates" in card


def test_dry_run_runs_everything_and_registers_nothing(story: dict[str, Any]) -> None:
    project = story["project"]
    registry = Registry(resolve_store(project))
    before = (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'")))
    result = relctl(project, "promote", story["runs"][1], "--dry-run", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    assert (report["outcome"], report["version"]) == ("dry-run", None)
    assert [g["status"] for g in report["gates"]] == ["pass", "pass", "pass"]
    assert {"intake", "validate", "package"} <= set(report["stages"])
    # Run 2 went through these stages when it was promoted: a re-run resumes them from their manifests.
    assert all(report["stages"][s]["resumed"] for s in ("intake", "merge", "reference", "convert"))
    assert (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'"))) == before


def test_undertrained_candidate_fails_eval_and_production_is_untouched(
        story: dict[str, Any], tiny_run: Any, tinyllm: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> None:
    project = story["project"]
    registry = Registry(resolve_store(project))
    before = registry.aliases(MODEL)
    production_em = float(registry.get_version(MODEL, before["production"]).tags["gate.eval.exact_match"])
    short = replace(tiny_run.config, base_steps=40, lora_steps=10)
    undertrained = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("undertrained"), short)
    run_id = load_train_module().log_run(undertrained, project, experiment=MODEL)
    summary = tmp_path_factory.mktemp("ci") / "summary.md"
    # fp32, so validation against the reference passes and the eval gate is what judges the model.
    result = relctl(project, "promote", run_id, "--precision", "fp32", "--json", "--summary", str(summary))
    assert result.exit_code == 1, result.output + result.stderr
    error = result.stderr.strip().splitlines()[-2]
    assert error.startswith("error: gate 'eval' failed: ") and "exact_match" in error
    report = json.loads(result.stdout)
    eval_result = next(g for g in report["gates"] if g["gate"] == "eval")
    check = next(c for c in eval_result["thresholds"] if c["metric"] == "exact_match" and c["kind"] == "absolute")
    assert check["passed"] is False and check["bound"] == 0.8 and check["value"] < 0.5
    assert check["production"] == pytest.approx(production_em)
    assert registry.aliases(MODEL) == before
    text = summary.read_text()
    assert "release blocked" in text and "exact_match" in text
    assert f"production is version {before['production']}" in text
    html = registry.client.download_artifacts(report["release_run"], "report/report.html")
    assert "exact_match" in Path(html).read_text()


def test_unknown_gate_id_is_bad_input_before_any_work(story: dict[str, Any], tmp_path: Path) -> None:
    config = tmp_path / "release.yaml"
    config.write_text("gates:\n  evl: {}\n")
    result = relctl(story["project"], "promote", story["runs"][1], "--config", str(config))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: release.yaml: unknown gate 'gates.evl'", "hint: did you mean 'eval'?"]


def test_malformed_eval_file_is_bad_input(story: dict[str, Any], tmp_path: Path) -> None:
    registry = Registry(resolve_store(story["project"]))
    before = (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'")))
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "reverse a b c d ->", "expected": "d c b a"}\n{"prompt": oops}\n')
    config = tmp_path / "release.yaml"
    config.write_text(f"gates:\n  eval:\n    dataset: {data}\n")
    result = relctl(story["project"], "promote", story["runs"][1], "--config", str(config))
    assert result.exit_code == 2, result.output + result.stderr
    assert "line 2" in result.stderr.strip().splitlines()[-2]
    assert (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'"))) == before


def test_impossible_load_slo_blocks_the_release(story: dict[str, Any], tmp_path: Path) -> None:
    project = story["project"]
    registry = Registry(resolve_store(project))
    before = registry.aliases(MODEL)
    config = tmp_path / "release.yaml"
    traffic = project / "traffic.jsonl"
    config.write_text(f"gates:\n  load:\n    traffic: {{rate: 8, requests: 20, dataset: {traffic}}}\n"
                      "    slos: {ttft_p99_ms: 0.001}\n")
    result = relctl(project, "promote", story["runs"][1], "--config", str(config), "--json")
    assert result.exit_code == 1, result.output + result.stderr
    error = result.stderr.strip().splitlines()[-2]
    assert error.startswith("error: gate 'load' failed: ") and "ttft_p99_ms" in error
    load = json.loads(result.stdout)["gates"][0]
    assert [c["metric"] for c in load["thresholds"] if not c["passed"]] == ["ttft_p99_ms"]
    assert registry.aliases(MODEL) == before


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


def render_page(url: str, tmp_path: Path) -> str:
    """The DOM of `url` after its JavaScript ran, from headless Chromium (installed by `make test`)."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed: `make test` installs it (apt-get install chromium)"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'chrome'}",
         "--virtual-time-budget=15000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_mlflow_ui_server_shows_aliases_tags_and_model_card(story: dict[str, Any], tmp_path: Path) -> None:
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
        # And the registry UI itself, rendered by a real headless browser.
        production = Registry(store).aliases(MODEL)["production"]
        dom = render_page(f"{base}/#/models/{MODEL}/versions/{production}", tmp_path)
        assert 'title="production"' in dom                      # the alias tag
        assert f"{MODEL} — int4 ONNX" in dom and "Validation against the fp32 reference" in dom  # model card
        assert "relctl.training_run_id" in dom and story["runs"][int(production) - 1] in dom      # lineage tags
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_register_subcommand_registers_a_package_with_its_lineage(story: dict[str, Any], tmp_path: Path) -> None:
    project, run2 = story["project"], story["runs"][1]
    package = next((project / ".relctl" / "work" / run2).glob("package-*/package"))
    result = relctl(project, "register", str(package), "--model", "manual", "--production", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    assert json.loads(result.stdout)["version"] == "1"
    registry = Registry(resolve_store(project))
    assert registry.aliases("manual") == {"production": "1"}
    tags = registry.get_version("manual", "1").tags
    assert tags["relctl.training_run_id"] == run2 and tags["relctl.gates"].startswith("not run")
    tampered = tmp_path / "package"
    shutil.copytree(package, tampered)
    (tampered / "model" / "genai_config.json").write_text("{}")
    result = relctl(project, "register", str(tampered), "--model", "manual")
    assert result.exit_code == 2 and "does not match its sha256" in result.stderr
    assert len(registry.client.search_model_versions("name='manual'")) == 1


def test_trace_follows_a_served_response_back_to_its_training_run(story: dict[str, Any], tmp_path: Path) -> None:
    from release.serving.process import ServerProcess

    project = story["project"]
    registry = Registry(resolve_store(project))
    production = registry.aliases(MODEL)["production"]
    with ServerProcess(f"{MODEL}@production", tmp_path / "serve", project_dir=project) as server:
        response = httpx.post(f"{server.url}/v1/completions", timeout=60,
                              json={"prompt": "reverse a b c d ->", "max_tokens": 4})
    assert response.status_code == 200, response.text
    headers = tmp_path / "headers.txt"
    headers.write_text("HTTP/1.1 200 OK\n" + "".join(f"{k}: {v}\n" for k, v in response.headers.items()))
    result = relctl(project, "trace", str(headers), "--json")
    assert result.exit_code == 0, result.output + result.stderr
    chain = json.loads(result.stdout)
    tags = registry.get_version(MODEL, production).tags
    assert (chain["model"], chain["version"]) == (MODEL, production)
    assert chain["training_run"]["id"] == story["runs"][int(production) - 1]
    assert chain["training_run"]["git_commit"] == tags.get("lineage.git_commit")
    assert chain["data_sha256"]["eval"] == tags["lineage.data.eval.sha256"]
    assert chain["release_run"]["outcome"] == "released" and chain["gates"]["eval"] == "pass"
    assert chain["integrity"]["ok"] is True and "serving_config_mismatch" not in chain
    text = relctl(project, "trace", f"{MODEL}:{production}")
    assert text.exit_code == 0 and story["runs"][int(production) - 1] in text.stdout and "verified" in text.stdout
    # Tamper with the released package in the artifact store: trace names the file (and exits 1).
    run_id = tags["relctl.release_run_id"]
    root = Path(registry.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "package"
    target = root / "model" / "genai_config.json"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b" ")
        tampered = relctl(project, "trace", f"{MODEL}:{production}")
        assert tampered.exit_code == 1, tampered.output + tampered.stderr
        assert "TAMPERED" in tampered.stdout and "model/genai_config.json does not match" in tampered.stdout
    finally:
        target.write_bytes(original)
