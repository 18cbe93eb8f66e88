"""The hostile-text corpus (tests/core/hostile.py) through what relctl prints and writes: `relctl history`
and `relctl status` on a real MLflow SQLite registry (a rollback reason and user, a tag value set in the
registry), the version's card after the rollback, the model card and the CI job summary of a blocked
release, and the gate reports. Each stays inert: one line per history entry and no raw control character
on the terminal; no HTML element, link, image, heading or extra list item from the text in any Markdown."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt

from release.cli import cli
from release.gating.contract import GateResult
from release.gating.report import render_html, render_markdown
from release.pipeline.report import ReleaseReport, model_card, summary_markdown
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from tests.core.hostile import CORPUS
from tests.core.test_escape import parse_html
from tests.registry.test_aliases import MODEL, _register

REASON = " / ".join(CORPUS)
# Elements the corpus would create if it were not escaped (relctl's own cards use `code`, strong and tables).
INJECTED = {"img", "script", "a", "h1", "h2", "h3", "blockquote", "pre", "em", "hr", "ol"}


def raw_controls(text: str) -> list[str]:
    return [repr(c) for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") and c != "\n"]


def rendered_tags(markdown: str) -> list[str]:
    return parse_html(MarkdownIt("commonmark").enable("table").render(markdown)).tags


@pytest.fixture
def rolled_back(project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _register(project_dir, tmp_path, 1)
    v2 = _register(project_dir, tmp_path, 2)
    Registry(resolve_store(project_dir)).set_version_tag(MODEL, "1", T.PRECISION, CORPUS[1] + CORPUS[0])
    monkeypatch.setenv("RELCTL_USER", CORPUS[4] + CORPUS[2])
    done = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "rollback", MODEL, "--reason", REASON])
    assert done.exit_code == 0, done.output
    assert v2 == "2"
    return project_dir


def test_history_prints_one_line_per_entry_with_controls_shown(rolled_back: Path) -> None:
    result = CliRunner().invoke(cli, ["--project-dir", str(rolled_back), "history", MODEL])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3, lines   # two promotes, one rollback: the reason's newlines forge no line
    assert raw_controls(result.stdout) == []
    assert "\\x1b[2J" in lines[-1] and "\\u202e" in lines[-1]   # shown, not executed


def test_status_shows_a_hostile_tag_value_inert(rolled_back: Path) -> None:
    result = CliRunner().invoke(cli, ["--project-dir", str(rolled_back), "status", MODEL])
    assert result.exit_code == 0, result.output
    assert raw_controls(result.stdout) == []
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith(f"{MODEL}@") for line in lines), lines   # one line per alias


def test_the_rolled_back_versions_card_carries_the_reason_as_text(rolled_back: Path) -> None:
    card = Registry(resolve_store(rolled_back)).get_version(MODEL, "2").description
    assert set(rendered_tags(card)) & INJECTED == set(), card
    assert "<img" not in card and "\n# Injected" not in card


def test_the_registry_page_carries_the_reason_as_one_escaped_cell(rolled_back: Path) -> None:
    """The registered model's page (MLflow's UI renders it) lists the alias history: the reason's newline forges no
    row and its HTML and Markdown stay text (issue 40: the cell only replaced '|' and newlines)."""
    page = Registry(resolve_store(rolled_back)).client.get_registered_model(MODEL).description
    # The page's own headings and version links are h2 and a: the reason adds none (its link stays text).
    assert set(rendered_tags(page)) & (INJECTED - {"a", "h2"}) == set(), page
    assert "](https://evil" not in page and page.count("\n## ") == 2
    rows = [line for line in page.splitlines() if line.startswith("| 20")]
    assert len(rows) == 3, rows   # two promotes, one rollback
    assert "<img" not in page and raw_controls(page) == []


def report_with(texts: list[str]) -> ReleaseReport:
    report = ReleaseReport(model="tiny-llm", training_run="a" * 32, release_run="b" * 32, precision="int4",
                           lineage={"training": {"run_id": "a" * 32, "run_name": texts[4] + texts[5]}})
    report.block([f"gate eval: {text}" for text in texts])
    report.notes.extend(texts)
    report.gates.append({"gate": "eval", "status": "fail", "reason": " / ".join(texts), "thresholds": []})
    return report


def test_the_model_card_and_the_job_summary_carry_failures_and_notes_as_text() -> None:
    hostile, benign = report_with(CORPUS), report_with(["plain words"] * len(CORPUS))
    for render in (model_card, lambda r: summary_markdown(r, None)):
        markdown = render(hostile)
        # The same elements as the same report with plain words: the text added no structure.
        assert rendered_tags(markdown) == rendered_tags(render(benign)), markdown
        assert raw_controls(markdown) == []


def test_gate_reports_carry_a_hostile_reason_as_text() -> None:
    hostile, benign = GateResult(gate="eval", status="fail", reason=REASON), GateResult(gate="eval", status="fail",
                                                                                         reason="plain words")
    assert rendered_tags(render_markdown([hostile], None)) == rendered_tags(render_markdown([benign], None))
    page = parse_html(render_html([hostile], {"package": CORPUS[4], "baseline": "none"}))
    plain = parse_html(render_html([benign], {"package": "plain", "baseline": "none"}))
    assert page.tags == plain.tags
