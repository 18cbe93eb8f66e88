"""precision: auto end to end (issue 29, step 4's must-show): one promote of the example with
examples/tiny-llm/release-auto.yaml releases the cheapest variant that passes, and the frontier (each
variant's paired quality difference with its interval vs its $/M output tokens, and why each other one was
not taken) is in the report, the model card and the job summary.

One promote: every variant onnxruntime-genai's installed builder makes on this CPU is built, validated,
judged sample by sample against the fp32 reference and load-tested on the example's seeded plan (several
minutes on a shared 2-core machine). The search's cost against its parts is benchmarks/precision_search.py's.
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

from release.backends import get_backend
from release.config import load_config
from release.gating.plugins import load_gates
from release.pipeline.engines import EngineRow, tied
from release.pipeline.precision_search import search_problems
from release.registry import Registry
from release.registry.store import resolve_store
from tests.conftest import load_train_module

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("precision-auto")
    shutil.copy(EXAMPLE / "release-auto.yaml", project / "release.yaml")
    shutil.copy(EXAMPLE / "traffic.jsonl", project / "traffic.jsonl")
    run_id = load_train_module().log_run(tiny_run, project, experiment="tiny-llm")
    summary = project / "summary.md"
    promote = subprocess.run([RELCTL, "--project-dir", str(project), "promote", run_id, "--json",
                              "--summary", str(summary)], capture_output=True, text=True, env=dict(os.environ),
                             timeout=2400)
    assert promote.returncode == 0, promote.stderr[-4000:]
    report = json.loads(promote.stdout)
    registry = Registry(resolve_store(project))
    card = Path(registry.client.download_artifacts(report["release_run"], "report/model_card.md")).read_text()
    return {"report": report, "summary": summary.read_text(), "card": card, "stderr": promote.stderr,
            "registry": registry}


def test_every_variant_is_measured_and_the_cheapest_that_passes_is_released(searched: dict[str, Any]) -> None:
    report = searched["report"]
    engines = report["engines"]
    rows = {r["precision"]: r for r in engines["rows"]}
    offered = get_backend("onnxruntime-genai").precision_variants({}, "cpu")
    assert set(offered) <= set(rows) and "fp16" not in rows
    paired = engines["precision_search"]["paired"]
    for precision, row in rows.items():
        verdict = paired.get(f"onnxruntime-genai {precision}")
        if verdict is None:  # refused by validation: no paired eval, no load test (early stop)
            assert not row["quality_passed"] and row["rate"] is None
        elif verdict["outcome"] != "non_inferior":  # refused by the paired test: never load-tested
            assert row["rate"] is None and "paired eval" in row["rejected"]
        else:
            assert row["rate"] is not None and row["cost_per_million_tokens"] is not None
    chosen = engines["chosen"]["precision"]
    winner = rows[chosen]
    assert winner["rejected"] is None and paired[f"onnxruntime-genai {chosen}"]["outcome"] == "non_inferior"
    # Nothing that passed is cheaper than the release, unless within measured repeat noise (a tie).
    as_row = {p: EngineRow(**r) for p, r in rows.items()}
    for precision, row in rows.items():
        if precision == chosen or row["cost_per_million_tokens"] is None or not row["slo_met"]:
            continue
        assert row["rejected"].startswith(("dearer", "tie with")), row
        if row["cost_per_million_tokens"] < winner["cost_per_million_tokens"]:
            assert tied(as_row[precision], as_row[chosen])
    # The release is that variant's build: the package records it, and the version says it.
    assert report["precision"] == chosen and report["outcome"] == "released"
    version = searched["registry"].get_version("tiny-llm", report["version"])
    assert version.tags["relctl.precision"] == chosen
    assert any(line.startswith(f"chosen: onnxruntime-genai {chosen}") for line in engines["why"])


def test_the_frontier_is_in_the_report_card_and_job_summary(searched: dict[str, Any]) -> None:
    search = searched["report"]["engines"]["precision_search"]
    frontier = search["frontier"]
    assert len(frontier) == len(searched["report"]["engines"]["rows"])
    # One released variant (a tie within repeat noise may take one just off the strict frontier); the
    # frontier holds only variants that passed their paired eval.
    assert len([e for e in frontier if e["chosen"]]) == 1
    assert any(e["on_frontier"] for e in frontier)
    assert all(e["paired"] == "non_inferior" for e in frontier if e["on_frontier"])
    judged = [e for e in frontier if e["paired"]]
    assert judged and all(m["interval"][0] <= m["difference"] <= m["interval"][1]
                          for e in judged for m in e["metrics"].values())
    assert all(e["why_not"] for e in frontier if not e["chosen"])  # why each other variant was not taken
    for text in (searched["card"], searched["summary"]):
        assert "Precision frontier (precision: auto)" in text and "**released**" in text
        for entry in frontier:
            assert f"| onnxruntime-genai {entry['precision']} |" in text
    cost = search["cost"]
    assert cost["wall_s"] > 0 and cost["parts_s"] > 0 and any(k.startswith("paired eval") for k in cost["parts"])
    assert cost["builds_s"] + cost["evals_s"] == pytest.approx(cost["parts_s"], abs=0.01)


def test_a_search_without_margins_or_load_gate_is_refused_before_any_stage(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump({"convert": {"precision": "auto"},
                                    "gates": {"eval": {"thresholds": {"exact_match": {"threshold": 0.5}}}}}))
    problems = search_problems(load_config(path), load_gates(load_config(path).gates))
    assert any("gates.load is not configured" in p.message for p in problems)
    assert any("sets no margins" in p.message for p in problems)
