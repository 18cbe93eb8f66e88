"""The eval gate's paired comparison on real tiny models: a damaged variant that clears the threshold is
refused, a small eval set is underpowered (never a pass), and margins are checked before any stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from gates.base import GateContext, GateResult, ProductionRef
from gates.eval_data import DataRules, load_eval_set
from gates.metrics import resolve_metrics
from gates.packaged import complete, load_package_model
from gates.paired import compare
from gates.samples import SampleScores
from release.backends import backend_for_folder
from release.cli import cli
from release.config import load_config
from release.core.package import build_package, read_manifest
from release.gating.contract import blocks
from release.gating.plugins import load_gates, run_gates
from release.gating.run import evidence_digests
from release.pipeline.report import ReleaseReport, decision_table
from release.registry.store import connect, ensure_experiment, resolve_store
from release.signing.keys import release_key, trusted_keys
from release.signing.package import sign_package, verify_signature
from release.stages.register import provenance

THRESHOLD = 0.75     # the team's absolute bar on exact match
MARGIN = 0.05        # non-inferiority margin: at most five points of exact match worse than production
MIN_LOST = 8         # rows the damage must turn wrong for the test to mean something
LM_HEAD = "lm_head.MatMul.weight"  # the genai builder's name for the output projection


def eval_gate(config: dict[str, Any], package: Path, work: Path, eval_set: Path, production: Path | None,
              **context: Any) -> GateResult:
    (gate,) = load_gates({"eval": config})
    prod = ProductionRef("1", production, {}) if production else None
    (result,) = run_gates([gate], lambda gate_id: GateContext("tiny-llm", package, work / gate_id, prod,
                                                              eval_dataset=eval_set, **context))
    return result


def zero_largest(model_dir: Path, token: int, k: int) -> None:
    """Zero the k largest-magnitude weights of one token's output column (a few of the lm_head's 25,600)."""
    model = onnx.load(str(model_dir / "model.onnx"))
    init = next(i for i in model.graph.initializer if i.name == LM_HEAD)
    weights = numpy_helper.to_array(init).copy()
    rows = np.argsort(-np.abs(weights[:, token]))[:k]
    weights[rows, token] = 0.0
    init.CopyFrom(numpy_helper.from_array(weights, init.name))
    (model_dir / "model.onnx.data").unlink()
    onnx.save(model, str(model_dir / "model.onnx"), save_as_external_data=True, location="model.onnx.data")


def correct_rows(model_dir: Path, eval_set: Path) -> list[bool]:
    model = backend_for_folder(model_dir).load(model_dir)
    rows = load_eval_set(eval_set, DataRules()).rows
    return [complete(model, r.prompt, 16) == r.expected.strip() for r in rows]


@pytest.fixture(scope="module")
def damaged_package(trained_package: Path, eval_set: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained package with a few lm_head weights of the token " c" zeroed: the fewest (from 8 up) that
    turn at least MIN_LOST of production's right answers wrong."""
    out = tmp_path_factory.mktemp("damaged")
    good = correct_rows(trained_package / "model", eval_set)
    token = load_package_model(trained_package).encode(" c")[-1]
    for k in range(8, 41, 4):
        model_dir = out / f"model-{k}"
        shutil.copytree(trained_package / "model", model_dir)
        zero_largest(model_dir, token, k)
        lost = sum(g and not d for g, d in zip(good, correct_rows(model_dir, eval_set), strict=True))
        if lost >= MIN_LOST:
            break
    else:
        pytest.fail(f"zeroing up to 40 weights of token {token} lost fewer than {MIN_LOST} rows")
    return build_package(out / "package", model_dir, trained_package / "source",
                         {"model_name": "tiny-llm", "precision": "fp32"}, backend_for_folder(model_dir)).root


@pytest.fixture(scope="module")
def damaged_result(damaged_package: Path, trained_package: Path, eval_set: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    config = {"metrics": ["exact_match"], "thresholds": {"exact_match": {"threshold": THRESHOLD}},
              "margins": {"exact_match": MARGIN}, "against": ["production"]}
    return eval_gate(config, damaged_package, tmp_path_factory.mktemp("damaged-gate"), eval_set, trained_package)


def test_a_damaged_variant_that_clears_the_threshold_is_refused_by_the_paired_test(
        damaged_result: GateResult) -> None:
    result = damaged_result
    (threshold,) = result.thresholds
    assert threshold.passed and threshold.value is not None and threshold.value >= THRESHOLD  # aggregate: pass
    (paired,) = result.details["paired"]
    assert paired["outcome"] == "inferior" and paired["test"] == "mcnemar-exact"
    assert paired["n"] == 64 and paired["difference"] <= -MIN_LOST / 64
    assert paired["interval"][1] < -MARGIN < 0
    assert result.status == "fail" and blocks(result.status)
    assert f"vs production v1: exact_match: n=64, difference {paired['difference']:+.4f}" in result.reason
    assert f"margin {MARGIN:g}" in result.reason and "inferior" in result.reason
    # The card's row for the gate names the same figures.
    report = ReleaseReport(model="tiny-llm", training_run="r", release_run=None, precision="fp32",
                           gates=[{"gate": "eval", "status": result.status, "reason": result.reason,
                                   "thresholds": [], "details": result.details}])
    row = next(line for line in decision_table(report) if line.startswith("| gate `eval`"))
    assert "exact_match vs production v1:" in row and "n=64, margin 0.05 (**inferior**)" in row


def test_the_per_sample_evidence_recomputes_the_verdict_and_is_signed(
        damaged_result: GateResult, damaged_package: Path) -> None:
    samples = next(p for p in damaged_result.evidence if p.name == "eval-samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 64 and {"candidate", "production"} <= set(rows[0])

    def side(role: str) -> SampleScores:
        return SampleScores("exact_match", "binary", True, tuple(r["id"] for r in rows),
                            tuple(float(r[role]["exact_match"]) for r in rows))

    again = compare(side("candidate"), side("production"), MARGIN)
    (paired,) = damaged_result.details["paired"]
    assert again.difference == paired["difference"] and list(again.interval) == list(paired["interval"])
    # The signature's provenance vouches for every evidence file by its digest.
    digests = evidence_digests([damaged_result])
    assert set(digests) == {f"gates/eval/{p.name}" for p in damaged_result.evidence}
    signed = provenance("tiny-llm", read_manifest(damaged_package), {}, {"gate.eval.status": "fail"}, "run", "test",
                        digests)
    signing = load_config(None).signing
    key = release_key(signing, damaged_package)
    assert key is not None
    sign_package(damaged_package, key, signed)
    verdict = verify_signature(damaged_package, trusted_keys(signing, damaged_package), "damaged", folder=True)
    assert verdict.status == "verified"
    assert verdict.provenance["gate_evidence_sha256"]["gates/eval/eval-samples.jsonl"] == \
        digests["gates/eval/eval-samples.jsonl"]


def test_a_small_eval_set_is_underpowered_never_a_pass(trained_package: Path, eval_set: Path,
                                                       tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text("".join(eval_set.read_text().splitlines(keepends=True)[:12]))
    config = {"metrics": ["exact_match", "perplexity"], "thresholds": {"exact_match": {"threshold": 0.5}},
              "margins": {"exact_match": MARGIN, "perplexity": 0.05}}
    merged = trained_package.parent / "merged"  # package_checkpoint (conftest) builds it beside the package
    reference = backend_for_folder(trained_package / "model")
    result = eval_gate(config, trained_package, tmp_path, small, trained_package,
                       load_reference=lambda: reference.load_reference(merged))
    outcomes = {(c["metric"], c["against"]): c for c in result.details["paired"]}
    assert set(outcomes) == {(m, b) for m in ("exact_match", "perplexity")
                             for b in ("production v1", "fp32 reference")}
    em = outcomes[("exact_match", "production v1")]
    # Candidate and production are the same model: no row differs, yet 12 rows cannot show a 5-point margin.
    assert em["difference"] == 0 and em["outcome"] == "underpowered" and em["needed_n"] > 12
    assert outcomes[("exact_match", "fp32 reference")]["outcome"] == "underpowered"
    assert result.status == "underpowered" and blocks(result.status)
    assert f"underpowered (needs about {em['needed_n']} samples for 80% power)" in result.reason


def test_relctl_gate_exits_1_on_underpowered(trained_package: Path, eval_set: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text("".join(eval_set.read_text().splitlines(keepends=True)[:8]))
    (tmp_path / "release.yaml").write_text(
        "gates:\n  eval:\n    metrics: [exact_match]\n    margins: {exact_match: 0.05}\n")
    out = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "gate", "eval", str(trained_package),
                                   "--baseline", str(trained_package), "--eval-dataset", str(small),
                                   "--out", str(tmp_path / "out")])
    assert out.exit_code == 1, out.output + out.stderr
    assert "underpowered" in out.output and "| exact_match | production baseline:package | 8 | +0.0000 |" in out.output
    assert "no fp32 reference in this run" in out.output


def test_check_reports_a_margin_without_a_metric_with_the_other_problems(
        project_dir: Path, tiny_checkpoint: Path) -> None:
    store = resolve_store(project_dir)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, "paired")) as run:
        mlflow.log_artifacts(str(tiny_checkpoint), "checkpoint")
        mlflow.log_text('{"prompt": "reverse a b c d ->"}\n', "validation/prompts.jsonl")
    (project_dir / "release.yaml").write_text(
        "gates:\n  eval:\n    dataset: missing.jsonl\n    metrics: [exact_match]\n"
        "    thresholds: {exact_match: {threshold: 0.8}}\n    margins: {exact_match: 0.02, bleu: 0.01}\n")
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "check", run.info.run_id])
    assert result.exit_code == 2, result.output + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert any("gates.eval.margins.bleu: 'bleu' is not in gates.eval.metrics" in e for e in errors), errors
    assert any("gates.eval.dataset: file 'missing.jsonl' not found" in e for e in errors), errors
    assert "hint: add 'bleu' to gates.eval.metrics or remove its margin (metrics: exact_match)" in result.stderr
    assert not (project_dir / ".relctl" / "work").exists() or not any((project_dir / ".relctl" / "work").iterdir())


@pytest.mark.parametrize(("margins", "message"), [
    ({"exact_match": -0.01}, "gates.eval.margins.exact_match: -0.01 is negative"),
    ({"exact_match": "lots"}, "gates.eval.margins.exact_match"),
])
def test_a_negative_or_non_numeric_margin_is_a_config_error(margins: dict[str, Any], message: str) -> None:
    from release.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_gates({"eval": {"thresholds": {"exact_match": {"threshold": 0.5}}, "margins": margins}})


def test_every_built_in_metric_has_a_per_sample_form() -> None:
    metrics = resolve_metrics(["exact_match", "token_accuracy", "perplexity"])
    assert [(m.name, m.sample_kind) for m in metrics] == [  # type: ignore[attr-defined]
        ("exact_match", "binary"), ("token_accuracy", "continuous"), ("perplexity", "continuous")]
