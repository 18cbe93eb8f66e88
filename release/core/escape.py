"""Free text (a reason, a user name, a tag value, a model's output) made inert for the medium it is written to.

Such text comes from whoever runs `relctl rollback --reason`, sets a tag in the registry UI, or trains the
model: it must never forge a line of `relctl history`, move the terminal's cursor, add a heading or an
`<img onerror>` to a model card, or change the structure of a YAML manifest. One function per medium:

- `terminal`: one line; control characters (C0, DEL, C1, line/paragraph separators, bidi overrides and
  other invisible format characters) shown as `\\x1b`, `\\n`, `\\u202e`: visible, never executed;
- `markdown`: `terminal`, then HTML-escaped and Markdown punctuation backslash-escaped: text, no structure
  (model cards, the registry page, GitHub job summaries: the same rules, so `job_summary` is it);
- `html`: `terminal`, then HTML-escaped (quotes too: safe in attributes);
- `yaml`: a double-quoted YAML scalar whose value is exactly the text.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Markdown punctuation that can open structure anywhere in a line (links, images, code, headings, tables,
# emphasis, math); `<`, `>` and `&` are HTML-escaped first. `_` is left alone: intraword it is inert in
# CommonMark, and metric names are full of it. A list marker counts only at the start of the text.
_MARKDOWN = re.compile(r"([\\`*{}\[\]()#|!~$])")
_LIST_START = re.compile(r"^(\s*[0-9]*)([-+.)])")


def _visible(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _hidden(char: str) -> bool:
    # Cc: C0, DEL, C1. Cf: bidi overrides/isolates, zero-width joiners, BOM. Zl/Zp: line/paragraph breaks.
    # Cs: lone surrogates (not text). Co/Cn: private use and unassigned (a terminal may act on them).
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def terminal(text: object) -> str:
    """One line of plain text with every control or invisible formatting character shown as an escape."""
    return "".join(_visible(c) if _hidden(c) else c for c in str(text))


def html(text: object) -> str:
    """Text for HTML (element content or a quoted attribute): `terminal`, then <, >, &, quotes escaped."""
    return _html.escape(terminal(text), quote=True)


def markdown(text: object) -> str:
    """Inline Markdown that renders as exactly the text: no HTML, link, image, heading, list or table."""
    escaped = _MARKDOWN.sub(r"\\\1", _html.escape(terminal(text), quote=False))
    return _LIST_START.sub(lambda m: m.group(1) + "\\" + m.group(2), escaped)


def job_summary(text: object) -> str:
    """A GitHub job summary is GitHub-flavoured Markdown with HTML: the Markdown rules."""
    return markdown(text)


def yaml_scalar(text: object) -> str:
    """A double-quoted YAML scalar whose value is the text (controls and non-ASCII escaped), on one line."""
    import yaml  # noqa: PLC0415 - the CLI imports this module for `terminal`; only YAML writers need PyYAML

    dumped: str = yaml.safe_dump(str(text), default_style='"', width=2**31 - 1, allow_unicode=False,
                            explicit_end=False)
    return dumped.rstrip("\n").removesuffix("\n...")
