"""The eval gate's separator is explicit: `relctl check` and promote warn when expected strings already start
with whitespace (a model continuation carries its own separator, and the gate adds gates.eval.separator)."""

from __future__ import annotations

import json
from pathlib import Path

from release.gating.contract import data_warnings
from release.gating.plugins import load_gates

ROWS = [{"prompt": "reverse a b ->", "expected": " b a"}, {"prompt": "reverse c d ->", "expected": " d c"},
        {"prompt": "reverse e f ->", "expected": "f e"}]


def test_the_warning_names_the_count_an_example_line_and_the_fix(tmp_path: Path) -> None:
    """`relctl check` and promote print it (tests/cli/test_contract_warnings.py runs both)."""
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (gate,) = load_gates({"eval": {"metrics": ["exact_match", "token_accuracy"],
                                   "thresholds": {"exact_match": {"threshold": 0.5}}}})
    (warning,) = data_warnings(gate, None, eval_set)
    assert warning.startswith("gates.eval: 2 of 3 expected strings in eval.jsonl start with whitespace "
                              "(line 1: ' b a')")
    assert "prompt + separator ' ' + expected" in warning and "set gates.eval.separator: ''" in warning


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
