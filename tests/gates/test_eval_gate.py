"""The eval gate on real tiny models through ONNX Runtime, against thresholds and production."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

import pytest

from gates.base import GateContext, GateResult, ProductionRef
from gates.eval import EvalGate
from release.core.errors import InputError
from release.gating.plugins import load_gates, run_gates
from release.gating.report import render_html, render_markdown

# Absolute bounds a usable model meets, plus no-regression bounds against production.
THRESHOLDS: dict[str, Any] = {
    "exact_match": {"threshold": 0.8, "min_absolute_change": -0.02},
    "token_accuracy": {"threshold": 0.9},
    "perplexity": {"threshold": 2.0, "min_relative_change": 0.0},
}


def run_eval(package: Path, work: Path, eval_set: Path | None, production: ProductionRef | None = None,
             **config: Any) -> GateResult:
    (gate,) = load_gates({"eval": {"thresholds": THRESHOLDS, **config}})
    (result,) = run_gates([gate], lambda gate_id: GateContext("tiny-llm", package, work / gate_id, production,
                                                              eval_dataset=eval_set))
    return result


def prod(package: Path, tags: dict[str, str] | None = None, metrics: dict[str, float] | None = None) -> ProductionRef:
    return ProductionRef(version="1", package_dir=package, tags=tags or {}, metrics=metrics or {})


@pytest.fixture(scope="module")
def first_release(trained_package: Path, eval_set: Path, tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    """The trained candidate's result when no production version exists yet."""
    return run_eval(trained_package, tmp_path_factory.mktemp("first"), eval_set)


def test_trained_candidate_passes_and_skips_the_relative_part(first_release: GateResult, eval_set: Path) -> None:
    result = first_release
    assert result.status == "pass", result.reason
    assert result.metrics["exact_match"] >= 0.9 and result.metrics["perplexity"] < 1.5
    assert [c.kind for c in result.thresholds] == ["absolute"] * 3
    assert "no-regression checks skipped" in result.reason
    assert len(result.details["skipped_checks"]) == 2
    predictions = [json.loads(line) for line in result.evidence[0].read_text().splitlines()]
    assert len(predictions) == len(eval_set.read_text().splitlines()) == result.details["rows"]
    assert sum(p["correct"] for p in predictions) / len(predictions) == result.metrics["exact_match"]
    assert "no production version" in render_markdown([result], None)


def test_undertrained_candidate_fails_naming_metric_value_threshold_and_production(
    undertrained_package: Path, trained_package: Path, eval_set: Path, tmp_path: Path,
) -> None:
    result = run_eval(undertrained_package, tmp_path, eval_set, prod(trained_package))
    assert result.status == "fail"
    assert result.details["production_source"] == "computed"
    em = result.metrics["exact_match"]
    prod_em = result.details["production_metrics"]["exact_match"]
    assert em < 0.8 <= prod_em
    assert f"exact_match {em:.4g} (needs >= 0.8, absolute, production {prod_em:.4g})" in result.reason
    markdown = render_markdown([result], "1")
    assert f"| exact_match | {em:.4g} | threshold >= | 0.8 | {prod_em:.4g} | FAIL |" in markdown
    html = render_html([result], {"model": "tiny-llm", "version": "2"})
    assert "Failing examples" in html and escape(result.details["failing_examples"][0]["prompt"]) in html


def test_slightly_worse_release_fails_no_regression_but_passes_absolute(
    half_tuned_package: Path, trained_package: Path, eval_set: Path, tmp_path: Path,
) -> None:
    result = run_eval(half_tuned_package, tmp_path, eval_set, prod(trained_package))
    assert result.status == "fail"
    absolute = [c for c in result.thresholds if c.kind == "absolute"]
    relative = [c for c in result.thresholds if c.kind != "absolute"]
    assert absolute and all(c.passed for c in absolute)
    failed = [c for c in relative if not c.passed]
    assert failed and "perplexity" in {c.metric for c in failed}
    ppl = next(c for c in failed if c.metric == "perplexity")
    assert ppl.production is not None and ppl.value is not None and ppl.production < ppl.value < 2.0
    assert "min_relative_change" in result.reason


def test_production_metrics_are_its_recorded_numbers_when_the_dataset_digest_matches(
    first_release: GateResult, trained_package: Path, eval_set: Path, tmp_path: Path,
) -> None:
    tags = {"gate.eval.dataset_sha256": first_release.details["dataset_sha256"]}
    recorded = {f"gate.eval.{k}": v for k, v in first_release.metrics.items()}
    # The package is gone: the gate may only read what production's release recorded, never compute.
    result = run_eval(trained_package, tmp_path, eval_set, prod(tmp_path / "deleted", tags, recorded))
    assert result.details["production_source"] == "recorded"
    assert result.details["production_metrics"] == first_release.metrics
    assert result.status == "pass", result.reason
    stale = {**tags, "gate.eval.dataset_sha256": "0" * 64}
    recomputed = run_eval(trained_package, tmp_path / "stale", eval_set, prod(trained_package, stale, recorded))
    assert recomputed.details["production_source"] == "computed"
    assert recomputed.details["production_metrics"] == first_release.metrics


def test_dataset_in_config_wins_and_bad_sets_are_input_errors(trained_package: Path, tmp_path: Path) -> None:
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"prompt": "reverse a b c d ->", "expected": "d c b a"}\n{"prompt": "x"\n')
    with pytest.raises(InputError, match=r"^eval.jsonl: line 2: not valid JSON"):
        run_eval(trained_package, tmp_path, None, dataset=str(bad))
    with pytest.raises(InputError, match=r"^eval gate: no eval set$"):
        run_eval(trained_package, tmp_path, None)


def test_gate_object_runs_without_thresholds(trained_package: Path, tmp_path: Path) -> None:
    data = tmp_path / "two.jsonl"
    data.write_text('{"prompt": "reverse a b c d ->", "expected": "d c b a"}\n'
                    '{"prompt": "reverse h g f e ->", "expected": "e f g h"}\n')
    gate = EvalGate(EvalGate.Config.model_validate({"metrics": ["exact_match"], "dataset": str(data)}))  # type: ignore[arg-type]
    work = tmp_path / "work"
    work.mkdir()
    result = gate.run(GateContext("tiny-llm", trained_package, work, None))
    # It measures, but with nothing to check it is "not evaluated", never "pass" (issue 21).
    assert result.status == "skipped" and set(result.metrics) == {"exact_match"} and not result.thresholds


def test_an_eval_gate_without_thresholds_is_refused_before_any_stage() -> None:
    (gate,) = load_gates({"eval": {}})
    problems = gate.preflight(None)  # type: ignore[attr-defined]
    assert [p.message for p in problems] == [
        "release.yaml: gates.eval sets no thresholds, so the eval gate would pass whatever the model scores "
        "(0% exact match included)"]
    (bounded,) = load_gates({"eval": {"thresholds": {"exact_match": {"threshold": 0.5}}}})
    assert bounded.preflight(None) == []  # type: ignore[attr-defined]


def test_an_eval_gate_without_thresholds_run_alone_is_not_evaluated_never_pass(
        undertrained_package: Path, eval_set: Path, tmp_path: Path) -> None:
    (gate,) = load_gates({"eval": {"thresholds": {}}})
    (result,) = run_gates([gate], lambda gate_id: GateContext("tiny-llm", undertrained_package, tmp_path / gate_id,
                                                              None, eval_dataset=eval_set))
    assert result.status == "skipped"
    assert result.reason.startswith("not evaluated: ")
    assert "pass" not in render_markdown([result], None).lower().replace("passes", "")
