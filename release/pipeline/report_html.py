"""report.html: the release as one self-contained page (the release run's `report/report.html`).

It leads with what a reviewer asks first (model and version, engine, precision, verdict), then shows what the
model card shows (the decision table, the engines and precision frontier tables, lineage and links) rendered
from the card's own Markdown, the plots inline (embedded PNGs, no file to fetch), the details behind the card
(validation against the reference, the memory plan, every number), and each gate's section with every detail
it reported (release/gating/report.py).

Everything on the page is escaped: the card's free text is escaped for Markdown when the card is written
(release/core/escape.py) and rendered with raw HTML off (markdown-it: no tag, no `javascript:` link gets
through); everything else is escaped here for HTML.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path

from markdown_it import MarkdownIt

from release.core.escape import html as _e
from release.gating.contract import GateResult
from release.gating.report import gates_html, html_page
from release.gating.run import plot_artifacts
from release.pipeline.report import VERDICT, ReleaseReport, details_markdown, model_card

IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


def _markdown() -> MarkdownIt:
    # CommonMark with tables; raw HTML off, so the text relctl escaped for Markdown stays text.
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def release_page(report: ReleaseReport, results: Sequence[GateResult], card_sections: list[str] | None = None) -> str:
    """The page for `report`: its model card (with `card_sections`, the tables the card carries, and without the
    list of plots: they are here inline), the details behind it, and the gates' results."""
    render = _markdown()
    card = model_card(report, card_sections, plot_links=False)
    parts = [_lead(report), render.render(_without_title(card))]
    figures = _figures({title: path for result in results for title, (path, _) in plot_artifacts(result).items()})
    if figures:
        parts += ["<h2>Plots</h2>", figures]
    details = details_markdown(report, None)
    if details.strip():
        parts.append(render.render(_without_title(details)))
    if results:
        parts.append(gates_html(results))
    version = f" v{report.version}" if report.version else ""
    return html_page(f"{report.model}{version}: {VERDICT.get(report.outcome, report.outcome)}", "".join(parts))


def _lead(report: ReleaseReport) -> str:
    """The facts a reviewer reads first: version, engine, precision, verdict."""
    backend = (report.engine or {}).get("backend") or report.package.get("backend") or "—"
    verdict = VERDICT.get(report.outcome, report.outcome)
    rows = [("version", f"v{report.version}" if report.version else "none registered"), ("engine", backend),
            ("precision", report.precision), ("verdict", verdict)]
    if report.production:
        rows.append(("compared with", f"production v{report.production.get('version')}"))
    rows += [("release run", report.release_run or "—"), ("training run", report.training_run)]
    body = "".join(f'<tr><th>{_e(k)}</th><td class="{_e(report.outcome) if k == "verdict" else ""}">{_e(v)}</td>'
                   "</tr>" for k, v in rows)
    title = f"{report.model} v{report.version}" if report.version else report.model
    # The card's own verdict sentence and engine line follow at once: not repeated here.
    return f"<h1>{_e(title)} — {_e(verdict)}</h1><table class=\"lead\">{body}</table>"


def _figures(plots: Mapping[str, Path]) -> str:
    """Each plot embedded as a data URI (the page stays one file); a plot whose file is gone is named."""
    out = []
    for title, path in plots.items():
        kind = IMAGE_TYPES.get(path.suffix.lower())
        if kind is None or not path.is_file():
            out.append(f"<p class=\"note\">{_e(title)}: not available here ({_e(path.name)})</p>")
            continue
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        out.append(f'<figure><img alt="{_e(title)}" src="data:{kind};base64,{data}">'
                   f"<figcaption>{_e(title)}</figcaption></figure>")
    return "".join(out)


def _without_title(markdown: str) -> str:
    """The Markdown without its first-level title (the page's own heading says it)."""
    lines = markdown.splitlines()
    return "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines)
