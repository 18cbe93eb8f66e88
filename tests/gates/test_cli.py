"""`relctl gate <id> <package>` through click: exit codes, one-line errors, JSON and reports."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner, Result

from release.commands.support import Ctx
from release.gating.cli import gate

RELEASE_YAML = {"gates": {"eval": {"thresholds": {"exact_match": {"threshold": 0.8, "min_absolute_change": -0.02}}}}}


def invoke(project_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(gate, list(args), obj=Ctx(project_dir, False, True))


def test_trained_package_passes_eval_with_json(project_dir: Path, trained_package: Path, eval_set: Path) -> None:
    (project_dir / "release.yaml").write_text(yaml.safe_dump(RELEASE_YAML))
    result = invoke(project_dir, "eval", str(trained_package), "--eval-dataset", str(eval_set), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gate"] == "eval" and data["status"] == "pass"
    assert set(data["metrics"]) == {"exact_match", "token_accuracy", "perplexity"}
    assert data["details"]["dataset_sha256"] and Path(data["evidence"][0]).is_file()
    assert "<table>" in Path(data["report"]).read_text()


def test_undertrained_against_a_baseline_blocks_with_exit_1(
    project_dir: Path, undertrained_package: Path, trained_package: Path, eval_set: Path,
) -> None:
    (project_dir / "release.yaml").write_text(yaml.safe_dump(RELEASE_YAML))
    result = invoke(project_dir, "eval", str(undertrained_package), "--eval-dataset", str(eval_set),
                    "--baseline", str(trained_package))
    assert result.exit_code == 1, result.output
    assert "| eval | ❌ fail | exact_match " in result.stdout
    assert "| exact_match |" in result.stdout and "vs prod (abs) >=" in result.stdout


def test_unsafe_package_fails_the_safety_gate(project_dir: Path, unsafe_package: Path) -> None:
    result = invoke(project_dir, "safety", str(unsafe_package), "--json", "--out", str(project_dir / "out"))
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["status"] == "fail" and data["metrics"]["harmful_violation_rate"] > 0.5
    assert (project_dir / "out" / "safety-failures.jsonl").read_text().count("\n") >= 1


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    # Warnings (an unsigned folder package, say) are their own lines; the refusal is one error and its hint.
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    return lines[0].removeprefix("error: ")


def test_bad_input_is_exit_2_with_one_line(project_dir: Path, trained_package: Path, tmp_path: Path) -> None:
    assert one_line_error(invoke(project_dir, "evl", str(trained_package))) == (
        "release.yaml: unknown gate 'gates.evl'")
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "reverse a b c d ->"}\n')
    assert one_line_error(invoke(project_dir, "eval", str(trained_package), "--eval-dataset", str(missing))) == (
        "missing.jsonl: column 'expected' is missing")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert one_line_error(invoke(project_dir, "eval", str(trained_package), "--eval-dataset", str(empty))) == (
        "empty.jsonl: the eval set is empty")
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text('{"prompt": "a", "expected": "b"}\n\n{"prompt": "a", "expected": }\n')
    assert one_line_error(invoke(project_dir, "eval", str(trained_package), "--eval-dataset", str(malformed))
                          ).startswith("malformed.jsonl: line 3: not valid JSON")
    config = tmp_path / "release.yaml"
    config.write_text(yaml.safe_dump({"gates": {"eval": {"metrics": ["exact_match", "bleu"]}}}))
    assert one_line_error(invoke(project_dir, "eval", str(trained_package), "-c", str(config))) == (
        "gates.eval.metrics: unknown metric 'bleu'")
    assert one_line_error(invoke(project_dir, "eval", str(tmp_path))).endswith("not a relctl package "
                                                                               "(relctl-package.json missing)")
