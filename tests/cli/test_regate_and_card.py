"""Evidence that cannot mislead, as a reviewer reads it.

End to end (real training run, real MLflow, real ONNX Runtime): a version released without gates, then the
same run promoted again with a memory gate, is re-gated: its `relctl.release_run_id` and `relctl trace`
name the release run that gated it, the first run stays in its history (and still serves the package), and
its card shows one memory target, the gate's. Then the card itself, rendered from a report: the verdict
first, the deciding figures rounded, and the rest (load rows, every metric) behind the details link.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.pipeline.report import DETAILS_ARTIFACT, ReleaseReport, details_markdown, model_card
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from tests.conftest import load_train_module

MODEL = "tiny-llm"
NO_GATES = "model: tiny-llm\nconvert:\n  precision: int4\n"
MEMORY_GATE = NO_GATES + "gates:\n  memory:\n    memory_gib: 2\n    concurrency: 4\n    context: 128\n" \
                         "    cold_start: false\n"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.fixture(scope="module")
def regated(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("regate")
    run_id = load_train_module().log_run(tiny_run, project, experiment=MODEL)
    (project / "release.yaml").write_text(NO_GATES)
    first = relctl(project, "promote", run_id, "--json")
    assert first.exit_code == 0, first.output + first.stderr
    (project / "release.yaml").write_text(MEMORY_GATE)
    second = relctl(project, "promote", run_id, "--json")
    assert second.exit_code == 0, second.output + second.stderr
    return {"project": project, "first": json.loads(first.stdout), "second": json.loads(second.stdout)}


def test_a_regated_version_names_the_run_that_gated_it(regated: dict[str, Any]) -> None:
    first, second = regated["first"], regated["second"]
    assert (first["outcome"], second["outcome"], second["version"]) == ("released", "re-gated", "1")
    assert first["gates"] == [] and second["gates"][0]["gate"] == "memory"
    registry = Registry(resolve_store(regated["project"]))
    tags = registry.get_version(MODEL, "1").tags
    assert tags[T.RELEASE_RUN] == second["release_run"] != first["release_run"]
    assert tags[T.RELEASE_RUNS] == f"{first['release_run']},{second['release_run']}"  # the history, oldest first
    assert tags["gate.memory.status"] == "pass"
    # The gating run carries the lineage itself: read on its own, it names the data and weights.
    gating = registry.get_run(second["release_run"]).tags
    assert gating["lineage.config_sha256"] == first["lineage"]["checkpoint"]["config_sha256"]


def test_trace_follows_the_gating_run_and_still_finds_the_package(regated: dict[str, Any]) -> None:
    first, second = regated["first"], regated["second"]
    result = relctl(regated["project"], "trace", f"{MODEL}:1", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    chain = json.loads(result.stdout)
    assert chain["release_run"]["id"] == second["release_run"] and chain["release_run"]["outcome"] == "re-gated"
    assert [(r["id"], r["role"]) for r in chain["release_runs"]] == [
        (first["release_run"], "registered the package"), (second["release_run"], "gated it again")]
    assert chain["gates"] == {"memory": "pass"}
    assert chain["integrity"]["ok"], chain["integrity"]  # fetched from the first run, which holds the package
    assert chain["config_sha256"] == first["lineage"]["checkpoint"]["config_sha256"]
    text = relctl(regated["project"], "trace", f"{MODEL}:1").stdout
    assert re.search(rf"release run +{second['release_run']} \(re-gated\)", text), text
    assert re.search(rf"earlier run +{first['release_run']} \(registered the package\)", text), text


def test_the_regated_card_has_one_memory_target_the_gates(regated: dict[str, Any]) -> None:
    first, second = regated["first"], regated["second"]
    registry = Registry(resolve_store(regated["project"]))
    card = registry.get_version(MODEL, "1").description
    assert card.splitlines()[2].startswith("**Re-gated**: v1 already served this package")
    assert f"gated again by release run [`{second['release_run']}`]" in card and first["release_run"] in card
    fit = next(line for line in card.splitlines() if line.startswith("| memory fit |"))
    assert "of a 1" in fit and "memory gate's target" in fit and "of a 24" not in fit  # 2 GiB less headroom, not 24
    assert "serving target" not in card and "24.00 GiB" not in card
    details = Path(registry.client.download_artifacts(second["release_run"], DETAILS_ARTIFACT)).read_text()
    assert "## Memory plan (the memory gate's target)" in details and "24.00 GiB" not in details
    assert f"/artifactPath/{DETAILS_ARTIFACT})" in card  # the card links the details of the gating run


def _report(outcome: str = "released") -> ReleaseReport:
    """A release's report as promote fills it (the figures of a real run of the example, at full precision)."""
    report = ReleaseReport(model=MODEL, training_run="t" * 32, release_run="r" * 32, precision="int4",
                           outcome=outcome, version="3")
    report.validation = {"checks": [
        {"metric": "top1_agreement", "value": 0.99209237098693848, "op": ">=", "bound": 0.95, "passed": True},
        {"metric": "mean_kl", "value": 0.0031415926535897931, "op": "<=", "bound": 0.05, "passed": True}],
        "metrics": {"top1_agreement": 0.99209237098693848, "mean_kl": 0.0031415926535897931}}
    report.memory = {"fits": True, "peak_bytes": 1.2e9, "capacity_bytes": 24 * 2**30, "concurrency": 8,
                     "context_tokens": 2048, "max_concurrency": 200, "rollout_replicas": 2}
    load_rows = {f"row_{i}_ms": 1000 / (i + 3) for i in range(30)}
    report.gates = [
        {"gate": "eval", "status": "pass", "reason": "", "metrics": {"exact_match": 0.8571428571428571},
         "thresholds": [{"metric": "exact_match", "value": 0.8571428571428571, "op": ">=", "bound": 0.8,
                         "passed": True}]},
        {"gate": "memory", "status": "pass", "reason": "fits: int4 at 4 x 512 tokens needs 40.0 MiB",
         "metrics": {"peak_gib": 0.0390625, "budget_gib": 1.8, "max_concurrency": 96.0},
         "thresholds": [{"metric": "peak_gib", "value": 0.039, "op": "<=", "bound": 1.8, "passed": True}]},
        {"gate": "load", "status": "fail", "reason": "SLO missed",
         "metrics": {**load_rows, "cost_per_million_tokens": 0.19234567891234, "ttft_p95_ms": 2345.678901},
         "thresholds": [
             {"metric": "error_rate", "value": 0.0, "op": "<=", "bound": 0.0, "passed": True},
             {"metric": "e2el_p99_ms", "value": 812.3456, "op": "<=", "bound": 10000.0, "passed": True},
             {"metric": "goodput", "value": 7.9, "op": ">=", "bound": 7.0, "passed": True},
             {"metric": "ttft_p95_ms", "value": 2345.678901, "op": "<=", "bound": 2000.0, "passed": False}]}]
    return report


def test_the_card_leads_with_the_verdict_and_the_deciding_figures() -> None:
    report = _report()
    report.links = {"every figure (details)": "#/experiments/1/runs/r/artifactPath/report/details.md"}
    card = model_card(report)
    lines = card.splitlines()
    assert lines[2] == "**Released**: v3 passed validation and every gate. First release of this model: " \
                       "nothing to compare with."
    table = card.split("## What decided it", 1)[1].split("\n\n", 1)[0]
    assert table.index("| validation vs fp32 (int4) | pass | top1_agreement 0.992 >= 0.95; mean_kl 0.00314 "
                       "<= 0.05 |") > 0
    assert "| gate `eval` | pass | exact_match 0.857 >= 0.8 |" in table
    # A failed gate shows the check that failed first, and no more than three figures.
    assert "| gate `load` | fail | ttft_p95_ms 2346 <= 2000 (**fail**); error_rate 0 <= 0; e2el_p99_ms " \
           "812 <= 10000; 1 more in the details |" in table
    # One memory target: the gate's (the stage's 24 GiB serving target never appears beside it).
    assert "| memory fit | fits | peak 40.00 MiB of a 1.80 GiB budget on the memory gate's target; up to 96 " \
           "concurrent sequences |" in table
    assert "24.00 GiB" not in card and "serving target" not in card
    assert "| cost |  | $0.192 per million output tokens (load gate) |" in table
    # The rest is behind the link: no load row, no 16-digit number on the card.
    assert "row_7_ms" not in card and not re.search(r"\d\.\d{6,}", card)
    assert "[`report/details.md`](#/experiments/1/runs/r/artifactPath/report/details.md)" in card


def test_extra_sections_sit_between_the_decision_and_the_details_link() -> None:
    card = model_card(_report(), ["## Engines\n| engine | version |\n|---|---|", "Approved by: someone"])
    assert card.index("## What decided it") < card.index("## Engines") < card.index("Approved by: someone") \
        < card.index("Every figure behind these")


def test_the_details_hold_every_figure_rounded_and_the_one_memory_target() -> None:
    report = _report()
    details = details_markdown(report, "### relctl gates\n\n| Gate | Status | Reason |\n|---|---|---|\n")
    assert "| top1_agreement | 0.992 | >= 0.95 | — | pass |" in details
    assert "| gate.load.row_7_ms | 100 |" in details and "| validation.mean_kl | 0.00314 |" in details
    assert "## Gates" in details and "## Memory plan (the memory gate's target)" in details
    assert "24.00 GiB" not in details
    report.gates = [g for g in report.gates if g["gate"] != "memory"]
    without_gate = details_markdown(report, None)
    assert "| accelerator memory | 24.00 GiB |" in without_gate  # no memory gate: the serving target's plan
    assert "serving target" in model_card(report)
