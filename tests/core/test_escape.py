"""One escaping function per medium, each checked against the hostile corpus by the medium's own parser:
CommonMark (markdown-it, as GitHub and MLflow's UI render Markdown), Python's HTML parser, PyYAML."""

from __future__ import annotations

import html.parser
import unicodedata

import pytest
import yaml
from markdown_it import MarkdownIt

from release.core import escape
from tests.core.hostile import CORPUS

HIDDEN = ("Cc", "Cf", "Zl", "Zp")


@pytest.mark.parametrize("text", CORPUS)
def test_terminal_is_one_line_with_every_control_visible(text: str) -> None:
    shown = escape.terminal(text)
    assert not any(unicodedata.category(c) in HIDDEN for c in shown), repr(shown)
    assert len(shown.splitlines()) == 1
    assert escape.terminal("plain text, café 😀") == "plain text, café 😀"   # printable text is untouched


class _Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text += data


def parse_html(markup: str) -> _Collect:
    parser = _Collect()
    parser.feed(markup)
    parser.close()
    return parser


@pytest.mark.parametrize("text", CORPUS)
def test_html_is_text_only(text: str) -> None:
    parsed = parse_html(f'<p title="{escape.html(text)}">{escape.html(text)}</p>')
    assert parsed.tags == ["p"]
    assert parsed.text == escape.terminal(text)


@pytest.mark.parametrize("render", [escape.markdown, escape.job_summary])
@pytest.mark.parametrize("text", CORPUS)
def test_markdown_renders_as_exactly_the_text(text: str, render: object) -> None:
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    for context in ("{}", "- {}", "| a | {} |\n|---|---|\n| x | {} |"):   # a paragraph, a list item, a table cell
        out = md.render(context.format(render(text), render(text)))  # type: ignore[operator]
        parsed = parse_html(out)
        allowed = {"p", "ul", "li", "table", "thead", "tbody", "tr", "th", "td"}
        assert set(parsed.tags) <= allowed, (context, out)
        assert parsed.tags.count("li") <= 1 and parsed.tags.count("tr") <= 2, out
    paragraph = parse_html(md.render(render(text)))  # type: ignore[operator]
    assert paragraph.text.strip() == escape.terminal(text).strip()


@pytest.mark.parametrize("text", [*CORPUS, "\ud800 lone surrogate", "😀 astral", ""])
def test_yaml_scalar_round_trips_and_stays_one_value(text: str) -> None:
    scalar = escape.yaml_scalar(text)
    assert "\n" not in scalar
    assert yaml.safe_load(f"key: {scalar}\nother: 1\n") == {"key": text, "other": 1}
