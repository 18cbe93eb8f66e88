"""docs/paired-eval.md's worked figures are what the code computes: the block between its markers is
gates/paired_figures.py's output (rewrite it with `python -m gates.paired_figures docs/paired-eval.md`)."""

from __future__ import annotations

from pathlib import Path

from gates.paired_figures import BEGIN, END, figures

PAGE = Path(__file__).resolve().parents[2] / "docs" / "paired-eval.md"


def test_the_docs_worked_figures_are_the_codes() -> None:
    text = PAGE.read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == figures(), "docs/paired-eval.md drifted: python -m gates.paired_figures docs/paired-eval.md"
