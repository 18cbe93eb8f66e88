"""Engines side by side (issue 19, item 4; issue 27: three engines): one promote measures the example on
onnxruntime-genai, vLLM and llama.cpp with the same prompts and seeded load plan, tabulates them in the report,
card and job summary, and `convert.backend: auto` releases the cheapest that met quality and the SLOs, saying why.

The example's recipe at head_dim 64 (vLLM's CPU attention, as tests/backends/test_vllm.py trains it).
Four entries: onnxruntime-genai int4 (refused on quality: max_mean_kl is set below what int4 reaches),
onnxruntime-genai fp32, vLLM fp32 and llama.cpp fp16 (both priced higher, so the choice is deterministic).
vLLM starts twice (validation, the load plan), about a minute each on a quiet machine; llama-server starts in
under a second. The selection tests after it run on the rows that promote measured, without starting anything.
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

from release.config import load_config
from release.core.errors import Blocked
from release.gating.plugins import load_gates
from release.pipeline.engines import Comparison, EngineRow, choose, engine_problems
from release.registry import Registry
from release.registry.store import resolve_store
from tests.conftest import load_tinyllm, load_train_module

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))
ENGINES = [{"backend": "onnxruntime-genai", "precision": "int4"},
           {"backend": "onnxruntime-genai", "precision": "fp32"},
           # Its own accelerator price, twice the load gate's: at the same offered rates both engines deliver
           # about the same tokens/s, so the choice is onnxruntime-genai fp32 by price, not by noise (and the
           # main flow's load gate does not start vLLM a third time).
           {"backend": "vllm", "precision": "fp32", "gpu_price_per_hour": 4.0},
           # The third engine, as the other priced one; llama-server starts in well under a second.
           {"backend": "llama-cpp", "precision": "fp16", "gpu_price_per_hour": 4.0}]
PRICES = {"onnxruntime-genai": 2.0, "vllm": 4.0, "llama-cpp": 4.0}
# int4 of this model is far above it; fp32 on either engine is far below (onnxruntime-genai's fp32 is its own
# reference: 0; vLLM's fp32 log-probabilities match PyTorch's to about 1e-6, a KL near 1e-12); llama.cpp's fp16
# of the head_dim-64 example measured 2.3e-07 (docs/llama-cpp.md).
MAX_MEAN_KL = 1e-6
LOAD = {"traffic": {"arrival": "poisson", "rate": 4, "requests": 24, "seed": 3, "dataset": "traffic.jsonl"},
        "slos": {"ttft_p95_ms": 5000, "e2el_p99_ms": 20000, "max_error_rate": 0.0},
        "cost": {"gpu_price_per_hour": 2.0}, "sweep": True, "sweep_rates": [4, 8], "step_duration_s": 2}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tinyllm = load_tinyllm()
    # The example's shape at head_dim 64, trained briefly: the engines are compared on this model, not judged
    # on its task (no eval gate), and the recipe's full 250 steps take many minutes on a shared CPU.
    config = tinyllm.every_engine(base_steps=30, lora_steps=10)
    trained = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("tiny-llm-hd64"), config)
    project = tmp_path_factory.mktemp("engines-project")
    example = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    release = {"model": "tiny-llm", "convert": {"backend": "auto"},
               "validation": {**example["validation"], "max_mean_kl": MAX_MEAN_KL},
               "engines": ENGINES, "gates": {"load": LOAD}}
    (project / "release.yaml").write_text(yaml.safe_dump(release))
    shutil.copy(EXAMPLE / "traffic.jsonl", project / "traffic.jsonl")
    run_id = load_train_module().log_run(trained, project, experiment="tiny-llm")
    summary = project / "summary.md"
    promote = subprocess.run([RELCTL, "--project-dir", str(project), "promote", run_id, "--json",
                              "--summary", str(summary)], capture_output=True, text=True, env=dict(os.environ),
                             timeout=1800)
    return {"project": project, "promote": promote, "summary": summary}


def report_of(compared: dict[str, Any]) -> dict[str, Any]:
    promote = compared["promote"]
    assert promote.returncode == 0, promote.stderr[-3000:]
    report: dict[str, Any] = json.loads(promote.stdout)
    return report


def rows_of(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["engine"], r["precision"]): r for r in report["engines"]["rows"]}


def test_one_promote_tabulates_every_engine_on_the_same_plan(compared: dict[str, Any]) -> None:
    report = report_of(compared)
    engines = report["engines"]
    rows = rows_of(report)
    assert list(rows) == [(e["backend"], e["precision"]) for e in ENGINES]
    assert engines["plan"]["traffic"]["seed"] == 3 and engines["plan"]["sweep_rates"] == [4.0, 8.0]
    for key in (("onnxruntime-genai", "fp32"), ("vllm", "fp32"), ("llama-cpp", "fp16")):  # end to end on each
        row = rows[key]
        assert row["quality_passed"] and row["top1_agreement"] >= 0.99 and row["mean_kl"] < MAX_MEAN_KL
        assert row["slo_met"] and row["rate"] in (4.0, 8.0)
        for number in ("ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s", "cost_per_million_tokens",
                       "cold_start_s"):
            assert row[number] is not None and row[number] > 0, (key, number, row)
        # docs/metrics.md's cost: price per hour x GPUs / (output tokens/s x 3600) x 1e6, at the judged rate.
        price = PRICES[key[0]]
        assert row["cost_per_million_tokens"] == pytest.approx(price / (row["output_tokens_per_s"] * 3600) * 1e6)
        assert row["memory_per_replica_bytes"] > 0
        assert row["limited_by"] and row["noise"] is not None  # what stopped the sweep; its repeat noise
    # One table, the same in the job summary and the model card.
    summary = compared["summary"].read_text()
    registry = Registry(resolve_store(compared["project"]))
    card = Path(registry.client.download_artifacts(report["release_run"], "report/model_card.md")).read_text()
    for text in (summary, card):
        assert "Engines side by side" in text and "| engine | precision |" in text
        assert "| vllm | fp32 |" in text and "| onnxruntime-genai | int4 |" in text and "| llama-cpp | fp16 |" in text
        assert "| limited by |" in text


def test_auto_releases_the_cheapest_engine_that_met_quality_and_slos(compared: dict[str, Any]) -> None:
    report = report_of(compared)
    engines, rows = report["engines"], rows_of(report)
    met = {k: r for k, r in rows.items() if r["quality_passed"] and r["slo_met"]}
    cheapest = min(met, key=lambda k: met[k]["cost_per_million_tokens"])
    assert (engines["chosen"]["engine"], engines["chosen"]["precision"]) == cheapest == ("onnxruntime-genai", "fp32")
    assert engines["selection"] == "auto" and report["precision"] == cheapest[1]
    assert report["outcome"] == "released" and report["gates"][0]["status"] == "pass"
    assert engines["why"][0].startswith(f"chosen: {cheapest[0]} {cheapest[1]}, the cheapest")
    other = next(k for k in met if k != cheapest)
    assert rows[other]["rejected"].startswith("dearer: $")
    assert any(line.startswith(f"not {other[0]} {other[1]}: dearer") for line in engines["why"])
    # The released package is the chosen engine's, resumed from the folder the comparison built.
    assert report["package"]["content_sha256"] == rows[cheapest]["package_content_sha256"]
    # Its load gate is the comparison's measurement of that very package (same plan and price), not a
    # second run of the same test.
    assert "measured in the engines comparison on this package, not run again" in compared["promote"].stderr
    gate = next(g for g in report["gates"] if g["gate"] == "load")
    assert gate["metrics"]["output_token_throughput"] == pytest.approx(rows[cheapest]["output_tokens_per_s"])


def test_an_engine_that_fails_quality_is_rejected_with_the_reason(compared: dict[str, Any]) -> None:
    report = report_of(compared)
    int4 = rows_of(report)[("onnxruntime-genai", "int4")]
    assert not int4["quality_passed"] and int4["mean_kl"] > MAX_MEAN_KL
    assert int4["rejected"].startswith("quality: ") and "mean_kl" in int4["rejected"]
    assert int4["rate"] is None  # never load-tested: quality failed first
    assert any(line.startswith("not onnxruntime-genai int4: quality: ") for line in report["engines"]["why"])


def test_selection_on_the_measured_rows(compared: dict[str, Any]) -> None:
    measured = report_of(compared)["engines"]["rows"]

    def fresh() -> list[EngineRow]:
        rows = [EngineRow(**row) for row in measured]
        for row in rows:  # as measured, before the choice: only quality and SLO reasons stay
            chosen_over = row.rejected and row.rejected.startswith(("dearer", "tie with"))
            row.rejected = None if chosen_over else row.rejected
        return rows

    rows = fresh()
    first = choose(Comparison("auto", rows, None))
    # The cheapest misses an SLO: the other engine that met everything is taken, and the miss is the reason.
    rows = fresh()
    missed = next(r for r in rows if r.engine == first.engine and r.precision == first.precision)
    missed.slo_met, missed.rejected = False, "SLOs: missed: ttft_p99_ms"
    second = choose(Comparison("auto", rows, None))
    assert (second.engine, second.precision) != (first.engine, first.precision) and second.rejected is None
    # Nothing meets them: blocked, naming every engine and why.
    rows = fresh()
    for row in rows:
        row.rejected = row.rejected or "SLOs: missed: e2el_p99_ms"
    with pytest.raises(Blocked) as blocked:
        choose(Comparison("auto", rows, None))
    assert "no engine meets quality and the SLOs" in blocked.value.message
    assert all(f"{r.engine} {r.precision}: " in blocked.value.message for r in rows)


def test_engines_are_checked_before_anything_is_built(tmp_path: Path) -> None:
    head_dim_16 = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4}
    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump({"engines": ENGINES}))
    cfg = load_config(path)
    problems = engine_problems(cfg, head_dim_16, [])
    assert "gates.load is not configured" in problems[0].message
    assert any("vllm at fp32" in p.message and "head_dim 16" in p.message for p in problems)
    priced = load_gates({"load": {"cost": {}}})
    assert "has no price" in engine_problems(cfg, head_dim_16, priced)[0].message
    path.write_text(yaml.safe_dump({"engines": [ENGINES[0], ENGINES[0]]}))
    with pytest.raises(Exception, match="listed twice"):
        load_config(path)
