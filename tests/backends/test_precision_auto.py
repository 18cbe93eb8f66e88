"""precision: auto end to end (issue 29, step 4's must-show; issue 38): one promote of the example with
examples/tiny-llm/release-auto.yaml releases the cheapest variant that passes and that no other passing
variant dominates on cost and paired quality, and the frontier (each variant's paired quality difference
with its interval vs its $/M output tokens, and why each other one was not taken) is in the report, the model
card and the job summary; the fp32 reference is scored once (the count is in the report), every long step
prints its line, and promote says where report.html is.

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
from release.pipeline.ranking import dominates
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
    # Issue 38: no passing variant dominates the release on cost and paired quality; one cheaper than it is
    # either tied with it (repeat noise, or both capped at the sweep's top) or dominated by another.
    as_row = {p: EngineRow(**r) for p, r in rows.items()}
    passing = [as_row[p] for p, r in rows.items() if r["slo_met"] and r["cost_per_million_tokens"] is not None
               and paired.get(f"onnxruntime-genai {p}", {}).get("outcome") == "non_inferior"]
    assert as_row[chosen].quality is not None and not any(dominates(o, as_row[chosen]) for o in passing)
    for row in passing:
        if row.precision == chosen:
            continue
        assert rows[row.precision]["rejected"].startswith(("dearer", "tie with", "dominated by")), row
        if row.cost_per_million_tokens < winner["cost_per_million_tokens"]:
            assert tied(row, as_row[chosen]) or any(dominates(o, row) for o in passing)
    capped = [r for r in passing if r.capped]
    if capped:  # the sweep's top rate reached: said on the chosen line, with the fix
        assert "widen gates.load.sweep_rates" in engines["why"][0]
    # The release is that variant's build: the package records it, and the version says it.
    assert report["precision"] == chosen and report["outcome"] == "released"
    version = searched["registry"].get_version("tiny-llm", report["version"])
    assert version.tags["relctl.precision"] == chosen
    assert any(line.startswith(f"chosen: onnxruntime-genai {chosen}") for line in engines["why"])


def test_the_reference_is_scored_once_and_every_step_says_so(searched: dict[str, Any]) -> None:
    # Issue 38: the fp32 reference's eval rows are scored once (batched), by the search, and reused by the
    # release's own eval gate; the count is in the report and the card.
    scoring = searched["report"]["reference_scoring"]
    assert scoring["scorings"] == 1, scoring
    assert [u["by"] for u in scoring["uses"] if u["scored"]] == ["precision: auto"]
    assert "eval gate" in [u["by"] for u in scoring["uses"] if not u["scored"]]
    assert "fp32 reference scored on the eval set once in this release" in searched["card"]
    # Every long step prints its line, marked by its outcome: a passing step is never the warning's `!`.
    stderr = searched["stderr"]
    assert "✓ reference eval" in stderr and "✓ paired eval onnxruntime-genai" in stderr
    assert "✓ load onnxruntime-genai" in stderr
    assert not [line for line in stderr.splitlines() if line.startswith("!") and (" pass" in line or
                                                                                 "non_inferior" in line)]


def test_promote_says_where_the_report_page_is_and_it_leads_with_the_release(searched: dict[str, Any]) -> None:
    report = searched["report"]
    where = next(line for line in searched["stderr"].splitlines() if line.startswith("→ report: "))
    page = Path(where.split("(file: ")[1].rstrip(")")).read_text()
    assert f"<h1>tiny-llm v{report['version']} — Released</h1>" in page
    assert f">{report['precision']}</td>" in page and ">onnxruntime-genai</td>" in page
    assert "Precision frontier (precision: auto)" in page and "Validation against the fp32 reference" in page
    assert "data:image/png;base64," in page


def test_the_frontier_is_in_the_report_card_and_job_summary(searched: dict[str, Any]) -> None:
    search = searched["report"]["engines"]["precision_search"]
    frontier = search["frontier"]
    assert len(frontier) == len(searched["report"]["engines"]["rows"])
    # One released variant, on the frontier (the choice and the frontier apply one dominance rule); the
    # frontier holds only variants that passed their paired eval.
    assert len([e for e in frontier if e["chosen"]]) == 1
    assert all(e["on_frontier"] for e in frontier if e["chosen"])
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
