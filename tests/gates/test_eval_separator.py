"""The eval gate's separator is explicit: `relctl check` warns when expected strings already start with
whitespace (a model continuation carries its own separator, and the gate adds gates.eval.separator)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
from click.testing import CliRunner

from release.cli import cli
from release.gating.contract import data_warnings
from release.gating.plugins import load_gates
from release.registry.store import connect, ensure_experiment, resolve_store

ROWS = [{"prompt": "reverse a b ->", "expected": " b a"}, {"prompt": "reverse c d ->", "expected": " d c"},
        {"prompt": "reverse e f ->", "expected": "f e"}]


def test_check_warns_when_expected_strings_carry_their_own_separator(project_dir: Path, tiny_checkpoint: Path,
                                                                     tmp_path: Path) -> None:
    store = resolve_store(project_dir)
    connect(store)
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with mlflow.start_run(experiment_id=ensure_experiment(store, "separator")) as run:
        mlflow.log_artifacts(str(tiny_checkpoint), "checkpoint")
        mlflow.log_text('{"prompt": "reverse a b c d ->"}\n', "validation/prompts.jsonl")
        mlflow.log_artifact(str(eval_set), "data")
    (project_dir / "release.yaml").write_text("gates:\n  eval:\n    metrics: [exact_match, token_accuracy]\n"
                                              "    thresholds: {exact_match: {threshold: 0.5}}\n")
    done = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "check", run.info.run_id])
    assert done.exit_code == 0, done.output + done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: gates.eval")]
    assert len(warnings) == 1, done.stderr
    assert "2 of 3 expected strings in eval.jsonl start with whitespace" in warnings[0]
    assert "prompt + separator ' ' + expected" in warnings[0] and "set gates.eval.separator: ''" in warnings[0]


def test_the_fix_silences_it_and_exact_match_alone_never_reads_the_separator(tmp_path: Path) -> None:
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("".join(json.dumps(r) + "\n" for r in ROWS))

    def warnings(**config: object) -> list[str]:
        run_set = load_gates({"eval": {"thresholds": {"exact_match": {"threshold": 0.5}}, **config}})[0]
        own_set = load_gates({"eval": {"dataset": "eval.jsonl", "thresholds": {"exact_match": {"threshold": 0.5}},
                                       **config}})[0]
        return data_warnings(run_set, None, eval_set) + data_warnings(own_set, tmp_path, None)

    assert len(warnings()) == 2   # the gate's own dataset (beside release.yaml) and the run's
    assert warnings(separator="") == []
    assert warnings(metrics=["exact_match"]) == []   # stripped on both sides: no separator involved
