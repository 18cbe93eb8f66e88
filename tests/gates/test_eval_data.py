"""Eval-set loading and Great Expectations validation: each bad input is one InputError line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.eval_data import DataRules, load_eval_set
from release.core.errors import InputError


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def row(prompt: object = "reverse a b ->", expected: object = "b a", **extra: object) -> str:
    return json.dumps({"prompt": prompt, "expected": expected, **extra})


def error_for(path: Path, rules: DataRules | None = None) -> InputError:
    with pytest.raises(InputError) as info:
        load_eval_set(path, rules or DataRules())
    assert "\n" not in info.value.message and info.value.hint
    return info.value


def test_valid_set_keeps_rows_lines_and_a_content_hash(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.jsonl", [row(), "", row("reverse c d ->", "d c", category="task")])
    data = load_eval_set(path, DataRules(label_set=["b a", "d c"]))
    assert [(r.line, r.expected) for r in data.rows] == [(1, "b a"), (3, "d c")]
    changed = write(tmp_path / "changed.jsonl", [row(), "", row("reverse c d ->", "c d")])
    assert load_eval_set(changed, DataRules()).sha256 != data.sha256


def test_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.jsonl", [json.dumps({"prompt": "x"}), json.dumps({"prompt": "y"})])
    assert error_for(path).message == "eval.jsonl: column 'expected' is missing"


def test_empty_set(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.jsonl", [])
    assert error_for(path).message == "eval.jsonl: the eval set is empty"


def test_malformed_line_names_its_line_number(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.jsonl", [row(), row(), '{"prompt": "x", "expected": '])
    assert error_for(path).message.startswith("eval.jsonl: line 3: not valid JSON")


def test_null_value_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.jsonl", [row(), row(expected=None), row()])
    assert error_for(path).message == "eval.jsonl: line 2: 'expected' is missing or null"


def test_wrong_type_length_and_label_set(tmp_path: Path) -> None:
    typed = write(tmp_path / "typed.jsonl", [row(), row(prompt=12)])
    assert error_for(typed).message == "typed.jsonl: line 2: 'prompt' must be a string"
    long = write(tmp_path / "long.jsonl", [row(expected="x" * 20), row(), row(expected="y" * 30)])
    assert error_for(long, DataRules(max_expected_chars=10)).message == (
        "long.jsonl: line 1: 'expected' must have 1 to 10 characters (and 1 more rows)")
    labels = write(tmp_path / "labels.jsonl", [row(expected="yes"), row(expected="maybe")])
    assert error_for(labels, DataRules(label_set=["yes", "no"])).message == (
        "labels.jsonl: line 2: 'expected' is not in the label set")


def test_row_count_bounds_and_non_object_lines(tmp_path: Path) -> None:
    few = write(tmp_path / "few.jsonl", [row(), row()])
    assert error_for(few, DataRules(min_rows=3)).message == "few.jsonl: 2 rows, the eval gate needs at least 3"
    listed = write(tmp_path / "list.jsonl", [row(), "[1, 2]"])
    assert error_for(listed).message == "list.jsonl: line 2: expected a JSON object, got list"
    assert error_for(tmp_path / "absent.jsonl").message.endswith("absent.jsonl: no such eval set")
