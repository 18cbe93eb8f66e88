"""`relctl promote` end to end on the example: real training runs, real MLflow, real ONNX Runtime.

One project goes through the story of the issue: v1 to production, v2 replaces it, rollback, history;
then a precision that fails its validation thresholds is blocked and production stays where it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.registry import Registry
from release.registry.client import logged_model_id
from release.registry.store import resolve_store
from tests.conftest import load_train_module

MODEL = "tiny-llm"
pytestmark = pytest.mark.slow


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def documented_version_tags() -> set[str]:
    """The tag names of the documented table of model-version tags (the first cell of each row)."""
    text = (Path(__file__).parents[2] / "docs" / "registry.md").read_text()
    section = text.split("### Tags on a model version", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE))


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
    # A small stable set of tags, documented in docs/registry.md; numbers are metrics; lineage lives on the release run.
    assert set(mv.tags) == {"relctl.training_run_id", "relctl.release_run_id", "lineage.git_commit",
                            "relctl.release_runs", "relctl.precision", "relctl.backend", "relctl.release_state",
                            "relctl.serving_config_hash",
                            "relctl.package_manifest_sha256", "relctl.package_content_sha256", "gate.eval.status",
                            "gate.safety.status", "gate.memory.status", "gate.load.status", "gate.canary.status",
                            "relctl.signed_by", "relctl.base_sha256", "relctl.merged_adapter_sha256"}
    assert documented_version_tags() >= {k for k in mv.tags if not k.endswith(".status")}
    assert mv.tags["relctl.training_run_id"] == story["runs"][0] and mv.tags["relctl.precision"] == "int4"
    # The run that registered v1 holds its package; release_run_id names the run that gated it last (this one,
    # unless another test of the module re-gated v1 before this one ran: pytest-randomly orders them).
    runs = mv.tags["relctl.release_runs"].split(",")
    assert runs[0] == report["release_run"] == mv.run_id and mv.tags["relctl.release_run_id"] == runs[-1]
    release_run = registry.get_run(report["release_run"]).tags
    assert len(release_run["lineage.config_sha256"]) == 64 and len(release_run["lineage.data.eval.sha256"]) == 64
    assert release_run["lineage.weights.model.safetensors.sha256"] == report["lineage"]["checkpoint"][
        "weights_sha256"]["model.safetensors"]
    assert mv.description.startswith(f"# {MODEL} — onnxruntime-genai int4")
    # The engine and why: auto's choice is named on the progress and on the card, never only implied.
    why = "convert.backend: auto took the first installed backend that builds LlamaForCausalLM at int4 on cpu"
    assert f"→ engine: onnxruntime-genai int4 ({why})" in story["results"][0].stderr
    assert f"Serves on **onnxruntime-genai** at **int4** ({why})." in mv.description
    assert report["engine"] == {"backend": "onnxruntime-genai", "precision": "int4", "why": why}
    assert "top1_agreement" in mv.description
    # Gates ran before registration and are summarized on the version.
    assert [(g["gate"], g["status"]) for g in report["gates"]] == [
        ("eval", "pass"), ("safety", "pass"), ("memory", "pass"), ("load", "pass"), ("canary", "skipped")]
    assert report["gates"][4]["reason"] == "no production version (first release)"
    load = report["gates"][3]
    assert load["metrics"]["error_rate"] == 0.0 and load["metrics"]["cost_per_million_tokens"] > 0
    assert mv.tags["gate.eval.status"] == "pass" and mv.tags["gate.canary.status"] == "skipped"
    # The numbers are metrics of the version's LoggedModel, which the MLflow UI shows on the version page.
    logged = {m.key: m.value for m in registry.client.get_logged_model(logged_model_id(mv)).metrics}
    eval_gate = report["gates"][0]
    assert logged["gate.eval.exact_match"] == eval_gate["metrics"]["exact_match"] >= 0.8
    assert logged["gate.load.error_rate"] == 0.0
    assert logged["validation.top1_agreement"] == report["validation"]["metrics"]["top1_agreement"]
    assert logged["memory.peak_bytes"] == report["memory"]["peak_bytes"]
    # The card leads with the verdict and the deciding figures; every other figure is behind its details link.
    assert "## What decided it" in mv.description and "report/details.md" in mv.description
    assert "| gate `load` | pass |" in mv.description and "| cost |" in mv.description


def test_second_promote_moves_production_and_previous(story: dict[str, Any]) -> None:
    second = story["results"][1]
    assert second.exit_code == 0, second.output + second.stderr
    report = json.loads(second.stdout)
    assert report["version"] == "2"
    # The example's release.yaml has a canary: v2 was `candidate` until it passed, then one move did it all.
    assert report["aliases"] == {"production": ["1", "2"], "previous": [None, "1"], "candidate": ["2", None]}
    assert next(g for g in report["gates"] if g["gate"] == "canary")["status"] == "pass"
    # The load gate replayed the same plan against production: reported and drawn beside the candidate.
    load = next(g for g in report["gates"] if g["gate"] == "load")
    assert load["details"]["production_label"] == "v1 production"
    assert load["details"]["production_metrics"]["error_rate"] == 0.0
    assert report["production"]["version"] == "1" and "gate.eval.exact_match" in report["production"]["metrics"]
    card = Registry(resolve_store(story["project"])).get_version(MODEL, "2").description
    assert "Replaced production [`v1`](#/models/tiny-llm/versions/1)" in card


def test_the_rolled_back_version_says_so_on_its_page(story: dict[str, Any]) -> None:
    registry = Registry(resolve_store(story["project"]))
    left, back = registry.get_version(MODEL, "2").description, registry.get_version(MODEL, "1").description
    first = left.splitlines()[0]
    assert re.match(r"\*\*Rolled back\*\* on \S+ to v1 by \S+: test rollback\. This version no longer serves "
                    r"production", first), first
    assert "**Released**: v2" in left  # the release's own evidence is kept, below the rollback line
    assert "Rolled back" not in back


def test_rollback_then_history_lists_three_moves(story: dict[str, Any]) -> None:
    result, aliases, history, status_result = story["rollback"]
    assert result.exit_code == 0, result.output
    assert f"{MODEL}: production v2 (onnxruntime-genai int4) -> v1 (onnxruntime-genai int4)" in result.output
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
    assert tags["relctl.release_run_id"] == report["release_run"]  # the run that gated it, not the first one
    assert tags["relctl.release_runs"].split(",")[-1] == report["release_run"]


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
    assert [g["status"] for g in report["gates"]] == ["pass", "pass", "pass", "pass"]
    assert {"intake", "validate", "package"} <= set(report["stages"])
    # Run 2 went through these stages when it was promoted: a re-run resumes them from their manifests.
    # (Whether intake and merge resume depends on the order tests run in: the release pruned their
    # checkpoints, a dry run before this one fetched them again; pruning is tested in test_workdirs.py.)
    assert all(report["stages"][s]["resumed"] for s in ("reference", "convert", "validate"))
    assert (registry.aliases(MODEL), len(registry.client.search_model_versions(f"name='{MODEL}'"))) == before


def test_undertrained_candidate_fails_eval_and_production_is_untouched(
        story: dict[str, Any], tiny_run: Any, tinyllm: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> None:
    project = story["project"]
    registry = Registry(resolve_store(project))
    before = registry.aliases(MODEL)
    production_em, _ = registry.recorded_numbers(registry.get_version(MODEL, before["production"]))
    production_em = production_em["gate.eval.exact_match"]
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
    assert "✗ gate eval" in result.stderr and "✓ gate eval" not in result.stderr
    # The gates after the failed one did not run: recorded as skipped, naming the gate that failed.
    later = report["gates"][[g["gate"] for g in report["gates"]].index("eval") + 1:]
    assert later and all(g["status"] == "skipped" and "gate 'eval' failed first" in g["reason"] for g in later)
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
    config.write_text(f"gates:\n  eval:\n    dataset: {data}\n    thresholds: {{exact_match: {{threshold: 0.0}}}}\n")
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
    error, hint = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: validation failed: ")
    assert "top1_agreement" in error or "mean_kl" in error
    # The cause is the precision: the hint names the next one up rather than only the thresholds.
    assert hint.startswith("hint: int4 loses too much against the fp32 reference: int8, the next precision up")
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


SCREENSHOTS = Path(os.environ.get("RELCTL_TEST_OUTPUT", Path(__file__).parents[2] / "test-output")) / "registry-ui"


def chromium(url: str, tmp_path: Path, screenshot: Path | None = None) -> str:
    """The DOM of `url` after its JavaScript ran, from headless Chromium (installed by `make test`); with
    `screenshot`, a PNG of the page instead (Chromium does one or the other per run)."""
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: `make test` installs it (apt-get install chromium)"
    action = ["--dump-dom"] if screenshot is None else [f"--screenshot={screenshot}", "--window-size=1400,2600"]
    done = subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'chrome'}", "--virtual-time-budget=15000", *action, url],
        capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@contextlib.contextmanager
def mlflow_server(store_uri: str) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 over the project's own store; yields its base URL."""
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri,
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
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_registry_ui_is_the_reviewers_page(story: dict[str, Any], tmp_path: Path) -> None:
    """Headless Chromium on a real `mlflow server`: v2's page shows the card, whose every link resolves to
    the page it names, and the release run's artifacts show the plots. Screenshots in test-output/."""
    store = resolve_store(story["project"])
    registry = Registry(store)
    mv = registry.get_version(MODEL, "2")  # promoted through the canary, replacing v1
    card = mv.description
    links = dict(re.findall(r"\[([^\]]+)\]\((#/[^)\s]+)\)", card))
    release_run, training_run = mv.tags["relctl.release_run_id"], mv.tags["relctl.training_run_id"]
    experiment = registry.get_run(release_run).experiment_id
    # The card links the release run, the training run, the version it replaced and each plot (relative
    # links: the embedded store has no server URL of its own).
    assert links[f"`{release_run}`"] == f"#/experiments/{experiment}/runs/{release_run}"
    assert links[f"`{training_run}`"].endswith(f"/runs/{training_run}")
    assert links["`v1`"] == f"#/models/{MODEL}/versions/1"
    plots = {title: url for title, url in links.items() if "/artifactPath/plots/" in url}
    assert {"load: latency cdf", "memory: memory plan"} <= set(plots) and any(t.startswith("canary:") for t in plots)
    assert "## What decided it" in card and "| memory fit |" in card
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with mlflow_server(store.tracking_uri) as base:
        page = f"{base}/#/models/{MODEL}/versions/2"
        dom = chromium(page, tmp_path)
        chromium(page, tmp_path, SCREENSHOTS / "version-page.png")
        assert f"{MODEL} — onnxruntime-genai int4" in dom and "validation vs fp32" in dom   # the card
        assert "memory fit" in dom and "relctl.release_run_id" in dom and "gate.canary.status" in dom
        for href in set(links.values()):  # the rendered card carries each link, and each one resolves
            assert f'href="{href}"' in dom, href
        assert release_run in chromium(f"{base}/{links[f'`{release_run}`']}", tmp_path)
        assert training_run in chromium(f"{base}/{links[f'`{training_run}`']}", tmp_path)
        replaced = chromium(f"{base}/{links['`v1`']}", tmp_path)
        assert f"{MODEL} — onnxruntime-genai int4" in replaced and "Version 1" in replaced
        # The registered model's page: aliases and the alias history as tables, not raw JSON tags.
        model = chromium(f"{base}/#/models/{MODEL}", tmp_path)
        chromium(f"{base}/#/models/{MODEL}", tmp_path, SCREENSHOTS / "model-page.png")
        assert "Alias history" in model and "test rollback" in model and f'href="#/models/{MODEL}/versions/2"' in model
        # MLflow 3.17's version page does not list metrics: its logged model's page does, linked both ways.
        numbers = f"{base}/{links['logged model']}"
        logged = chromium(numbers, tmp_path)
        chromium(numbers, tmp_path, SCREENSHOTS / "logged-model-metrics.png")
        assert all(name in logged for name in ("gate.eval.exact_match", "validation.top1_agreement",
                                               "gate.load.ttft_p99_ms", "memory.peak_bytes"))
        assert f'href="#/models/{MODEL}/versions/2"' in logged
        # The release run's artifacts: the plots are listed in the UI and served as PNG images.
        load_plot = plots["load: latency cdf"]
        artifacts = chromium(f"{base}/{load_plot}", tmp_path)
        chromium(f"{base}/{load_plot}", tmp_path, SCREENSHOTS / "release-run-plots.png")
        listed = httpx.get(f"{base}/api/2.0/mlflow/artifacts/list", params={"run_id": release_run, "path": "plots"},
                           timeout=10).json()["files"]
        names = {PurePosixPath(f["path"]).name for f in listed}
        assert {"load-latency-cdf.png", "memory-memory-plan.png"} <= names
        assert all(name in artifacts for name in names), "the artifacts tree lists every plot"
        for name in names:
            png = httpx.get(f"{base}/get-artifact", params={"path": f"plots/{name}", "run_uuid": release_run},
                            timeout=10)
            assert png.status_code == 200 and png.content.startswith(b"\x89PNG"), name
    for shot in ("version-page.png", "release-run-plots.png", "logged-model-metrics.png", "model-page.png"):
        assert (SCREENSHOTS / shot).stat().st_size > 20_000, f"{shot}: an empty page?"


def test_register_subcommand_registers_a_package_with_its_lineage(story: dict[str, Any], tmp_path: Path) -> None:
    project, run2 = story["project"], story["runs"][1]
    package = next((project / ".relctl" / "work" / run2).glob("package-*/package"))
    result = relctl(project, "register", str(package), "--model", "manual", "--production", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    assert json.loads(result.stdout)["version"] == "1"
    registry = Registry(resolve_store(project))
    assert registry.aliases("manual") == {"production": "1"}
    tags = registry.get_version("manual", "1").tags
    assert tags["relctl.training_run_id"] == run2 and tags["relctl.release_state"] == "released"
    assert not [k for k in tags if k.startswith("gate.")]
    assert "no gate ran" in registry.get_version("manual", "1").description
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
    lineage = registry.get_run(tags["relctl.release_run_id"]).tags  # the whole lineage is on the release run
    assert (chain["model"], chain["version"]) == (MODEL, production)
    assert chain["training_run"]["id"] == story["runs"][int(production) - 1]
    assert chain["training_run"]["git_commit"] == tags.get("lineage.git_commit") == lineage.get("lineage.git_commit")
    assert chain["data_sha256"]["eval"] == lineage["lineage.data.eval.sha256"]
    assert len(chain["weights_sha256"]["model.safetensors"]) == 64 and len(chain["config_sha256"]) == 64
    # Production (v1 after the rollback) was gated again by a later promote: trace names that run.
    assert chain["release_run"]["id"] == tags["relctl.release_run_id"]
    assert chain["release_run"]["outcome"] in ("released", "re-gated") and chain["gates"]["eval"] == "pass"
    assert chain["integrity"]["ok"] is True and "serving_config_mismatch" not in chain
    text = relctl(project, "trace", f"{MODEL}:{production}")
    assert text.exit_code == 0 and story["runs"][int(production) - 1] in text.stdout and "verified" in text.stdout
    assert chain["engine"] == "onnxruntime-genai" and "engine           onnxruntime-genai at int4" in text.stdout
    # Tamper with the released package in the artifact store (in the release run that registered it, the
    # first of the version's release runs): trace names the file (and exits 1).
    run_id = tags.get("relctl.release_runs", tags["relctl.release_run_id"]).split(",")[0]
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


def test_the_package_links_the_built_model_instead_of_copying_it(story: dict[str, Any], tmp_path: Path) -> None:
    """One copy of the built model on the work disk: the package's model files are hard links to the
    convert stage's output; a folder handed to `relctl package` is copied (its owner may edit it)."""
    project, run2 = story["project"], story["runs"][1]
    work = project / ".relctl" / "work" / run2
    package = next(work.glob("package-*/package"))
    built = next(work.glob("convert-*/model"))
    weights = package / "model" / "model.onnx.data"
    assert weights.stat().st_ino == (built / "model.onnx.data").stat().st_ino
    links = weights.stat().st_nlink  # 2, or more once another test re-promoted this run (another package folder)
    assert links >= 2
    assert {p.name for p in (package / "model").iterdir()} == {p.name for p in built.iterdir()}
    result = relctl(project, "package", str(built), str(next(work.glob("intake-*/checkpoint"))),
                    str(tmp_path / "handed"), "--model-name", "handed", "--precision", "int4")
    assert result.exit_code == 0, result.output + result.stderr
    assert (tmp_path / "handed" / "model" / "model.onnx.data").stat().st_nlink == 1
    assert (built / "model.onnx.data").stat().st_nlink == links
