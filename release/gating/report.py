"""Gate reports: a markdown table for CI job summaries and a self-contained HTML page for MLflow.

Both read only GateResult fields, so any plug-in gate is reported the same way. Failing examples come
from `details["failing_examples"]` (a list of flat dicts) when a gate provides them; every other detail a
gate reports is shown generically in the HTML (`details_html`). Every piece of text is escaped
(release/core/escape.py): reasons and model outputs are hostile text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from release.core import escape
from release.core.units import figure
from release.gating.contract import GateResult, ThresholdCheck

STATUS_MARK = {"pass": "✅ pass", "fail": "❌ fail", "skipped": "⏭️ skipped", "underpowered": "❌ underpowered"}
MAX_HTML_EXAMPLES = 20
MAX_CELL = 300


def render_markdown(results: Sequence[GateResult], production_version: str | None) -> str:
    """The gate table, then per gate its metrics vs thresholds vs production (GitHub-flavoured markdown)."""
    prod = f"production is version {production_version}" if production_version else "no production version yet"
    lines = ["### relctl gates", "", f"Compared with: {prod}.", "",
             "| Gate | Status | Reason |", "|---|---|---|"]
    lines += [f"| {r.gate} | {STATUS_MARK.get(r.status, r.status)} | {_md(r.reason)} |" for r in results]
    for result in results:
        rows = metric_rows(result)
        if not rows:
            continue
        lines += ["", f"#### {result.gate}", "", "| Metric | Value | Check | Bound | Production | Result |",
                  "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
        lines += [f"- {_md(note)}" for note in _notes(result)]
    for result in results:
        paired = paired_rows(result)
        if paired:
            lines += ["", f"#### {result.gate}: paired comparison", "", "| " + " | ".join(PAIRED_HEADER) + " |",
                      "|---|---|---|---|---|---|---|"]
            lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in paired]
        tasks = harness_rows(result)
        if tasks:
            lines += ["", f"#### {result.gate}: harness tasks", "", "| " + " | ".join(HARNESS_HEADER) + " |",
                      "|---|---|---|---|---|---|---|"]
            lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in tasks]
    return "\n".join(lines) + "\n"


PAIRED_HEADER = ["Metric", "Against", "n", "Difference", "Interval", "Margin", "Outcome"]


def paired_rows(result: GateResult) -> list[list[str]]:
    """One row per paired comparison a gate made (`details["paired"]`, gates/paired.py)."""
    rows = []
    for c in result.details.get("paired") or []:
        low, high = c["interval"]
        outcome = str(c["outcome"]).replace("_", "-")
        outcome = outcome if c["outcome"] == "non_inferior" else outcome.upper()  # as a failed check reads FAIL
        if c["outcome"] == "underpowered":
            outcome += f" (needs about {c['needed_n']} samples for {c.get('power', 0.8):.0%} power)" \
                if c.get("needed_n") else " (cannot decide)"
        rows.append([str(c["metric"]), str(c["against"]), str(c["n"]), f"{c['difference']:+.4f}",
                     f"[{low:+.4f}, {high:+.4f}] at {c.get('confidence', 0.95):.0%}", f"{c['margin']:g}", outcome])
    return rows


HARNESS_HEADER = ["Harness", "Task", "Metric", "n", "Candidate", "Production", "Paired"]


def harness_rows(result: GateResult) -> list[list[str]]:
    """One row per harness task metric (`details["harness_scores"]`, gates/harness/results.py: task_scores):
    the task's own score for candidate and production beside the paired verdict, where a margin compared it."""
    rows = []
    for s in result.details.get("harness_scores") or []:
        paired = s.get("paired") or {}
        verdict = str(paired.get("outcome", "")).replace("_", "-") if paired else "no margin"
        if paired.get("outcome") == "underpowered" and paired.get("needed_n"):
            verdict += f" (needs about {paired['needed_n']} samples for 80% power)"
        rows.append([str(s["harness"]), str(s["task"]), str(s["metric"]), str(s["n"]), f"{s['candidate']:.4g}",
                     "—" if s.get("production") is None else f"{s['production']:.4g}", verdict])
    return rows


def result_to_dict(result: GateResult) -> dict[str, Any]:
    """Every field of `result` as JSON-ready data (paths as strings)."""
    data = asdict(result)
    data["evidence"] = [str(p) for p in result.evidence]
    return data


def metric_rows(result: GateResult, num: Callable[[float | None], str] | None = None) -> list[list[str]]:
    """[metric, value, check, bound, production, result] per threshold check, then unchecked metrics; `num`
    writes the numbers (default: 4 significant digits, as the job summary shows them)."""
    fmt = num or _num4
    production = _production_values(result)
    rows: list[list[str]] = []
    checked: set[str] = set()
    for check in result.thresholds:
        checked.add(check.metric)
        prod = check.production if check.production is not None else production.get(check.metric)
        rows.append([check.metric, fmt(check.value), f"{_kind(check)} {check.op}", fmt(check.bound),
                     fmt(prod), "pass" if check.passed else "FAIL"])
    for metric, value in result.metrics.items():
        if metric not in checked:
            rows.append([metric, fmt(value), "", "", fmt(production.get(metric)), ""])
    return rows


def render_html(results: Sequence[GateResult], meta: Mapping[str, Any]) -> str:
    """A self-contained HTML report: run facts from `meta`, the gate table, each gate's section."""
    parts = [f"<h1>relctl release report</h1>{_facts(meta)}", gates_html(results)]
    title = f"relctl report: {meta.get('model', '')} {meta.get('version', '')}".strip()
    return html_page(title, "".join(parts))


def html_page(title: str, body: str) -> str:
    """One self-contained page (no external file, script or style): `body` is HTML this module or its caller
    composed from escaped text."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}</body></html>\n")


def gates_html(results: Sequence[GateResult], heading: str = "h2") -> str:
    """The gate table, then one section per gate: its reason, metrics against thresholds and production, paired
    comparisons, every other detail it reported (generically: any gate's, a plug-in's too), failing examples."""
    sub = f"h{int(heading[1]) + 1}"
    parts = [f"<{heading}>Gates</{heading}>", _gate_table(results)]
    for result in results:
        parts.append(f'<{heading} id="gate-{_e(result.gate)}">gate {_e(result.gate)} — '
                     f'<span class="{_e(result.status)}">{_e(result.status)}</span></{heading}>')
        parts.append(f"<p>{_e(result.reason)}</p>")
        rows = metric_rows(result, figure)
        if rows:
            parts.append(_table(["Metric", "Value", "Check", "Bound", "Production", "Result"], rows))
        parts += [f'<p class="note">{_e(note)}</p>' for note in _notes(result)]
        paired = paired_rows(result)
        if paired:
            parts.append(_table(PAIRED_HEADER, paired))
        parts.append(details_html(result.details))
        parts.append(_examples(result, sub))
        if result.evidence:
            parts.append("<p>Evidence (release run artifacts): " + ", ".join(
                f"<code>{_e(p.name)}</code>" for p in result.evidence) + "</p>")
    return "".join(parts)


CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:80em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
    "text-align:left;vertical-align:top}th{background:#f4f4f4}.pass,.released{color:#17692b}"
    ".fail,.blocked,.error{color:#b00020;font-weight:bold}.skipped{color:#777}"
    ".note{color:#555;font-style:italic}code{font-size:90%}td.text{white-space:pre-wrap;font-family:monospace}"
    ".empty{color:#777;font-style:italic}table.lead th{text-align:right}figure{margin:1em 0}"
    "figure img{max-width:100%;border:1px solid #ddd}details{margin:.5em 0}"
)
# Detail keys each gate section already shows in its own table.
SHOWN_DETAILS = frozenset({"failing_examples", "paired", "production_metrics", "skipped_checks"})
MAX_DETAIL_ITEMS = 20
MAX_DETAIL_DEPTH = 3


def _gate_table(results: Sequence[GateResult]) -> str:
    body = "".join(
        f'<tr><td><a href="#gate-{_e(r.gate)}">{_e(r.gate)}</a></td>'
        f'<td class="{_e(r.status)}">{_e(r.status)}</td><td>{_e(r.reason)}</td></tr>'
        for r in results
    )
    return f"<table><tr><th>Gate</th><th>Status</th><th>Reason</th></tr>{body}</table>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="{"fail" if c == "FAIL" else ""}">{_e(c)}</td>' for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def details_html(details: Mapping[str, Any]) -> str:
    """Every detail a gate reported that its section does not already show, as nested tables: what a plug-in
    gate (or a new figure, e.g. a harness task's candidate and production scores) puts there is shown without
    this page knowing it. Lists are cut at MAX_DETAIL_ITEMS, text at MAX_CELL."""
    shown = {k: v for k, v in details.items() if k not in SHOWN_DETAILS and not _nothing(v)}
    if not shown:
        return ""
    return f"<details><summary>Details ({len(shown)})</summary>{_value_html(shown, 0)}</details>"


def _nothing(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple | Mapping) and len(value) == 0)


def _value_html(value: Any, depth: int) -> str:
    if isinstance(value, Mapping):
        if depth >= MAX_DETAIL_DEPTH:
            return _e(_clip(value))
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_value_html(v, depth + 1)}</td></tr>" for k, v in value.items())
        return f"<table>{rows}</table>"
    if isinstance(value, list | tuple):
        items = list(value)[:MAX_DETAIL_ITEMS]
        more = len(value) - len(items)
        tail = f'<p class="note">{more} more not shown</p>' if more > 0 else ""
        if items and all(isinstance(i, Mapping) for i in items) and depth < MAX_DETAIL_DEPTH:
            columns = list(dict.fromkeys(k for i in items for k in i))
            head = "".join(f"<th>{_e(c)}</th>" for c in columns)
            body = "".join("<tr>" + "".join(f"<td>{_value_html(i.get(c), depth + 1)}</td>" for c in columns)
                           + "</tr>" for i in items)
            return f"<table><tr>{head}</tr>{body}</table>{tail}"
        return ", ".join(_value_html(i, depth + 1) for i in items) + tail
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _e(figure(value))
    if value is None:
        return "—"
    return _text(value)


def _examples(result: GateResult, heading: str = "h3") -> str:
    examples = result.details.get("failing_examples") or []
    if not examples:
        return ""
    columns = list(dict.fromkeys(k for ex in examples for k in ex))
    body = "".join(
        "<tr>" + "".join(f'<td class="text">{_text(ex.get(c, ""))}</td>' for c in columns) + "</tr>"
        for ex in examples[:MAX_HTML_EXAMPLES]
    )
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    shown = min(len(examples), MAX_HTML_EXAMPLES)
    return (f"<{heading}>Failing examples ({shown} of {len(examples)} shown)</{heading}>"
            f"<table><tr>{head}</tr>{body}</table>")


def _text(value: Any) -> str:
    """Free text for a cell (a model's output: hostile): escaped, clipped, and an empty one marked as such
    (a refusal that answered nothing reads "(empty)", not a blank cell)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _e(figure(value))
    text = str(value)
    if not text.strip():
        return '<span class="empty">(empty)</span>' if not text else \
            f'<span class="empty">(whitespace only: {_e(repr(text))})</span>'
    return _e(_clip(text))


def _facts(meta: Mapping[str, Any]) -> str:
    if not meta:
        return ""
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in meta.items())
    return f"<table>{rows}</table>"


def _production_values(result: GateResult) -> dict[str, float]:
    values = result.details.get("production_metrics") or {}
    return {str(k): float(v) for k, v in values.items()}


def _notes(result: GateResult) -> list[str]:
    return [str(n) for n in result.details.get("skipped_checks") or []]


def _kind(check: ThresholdCheck) -> str:
    return {"absolute": "threshold", "min_absolute_change": "vs prod (abs)",
            "min_relative_change": "vs prod (rel)"}[check.kind]


def _num4(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _clip(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_CELL else text[:MAX_CELL] + "…"


def _cell(text: str) -> str:
    """A table cell relctl composed (metric names and figures): only what would break the table."""
    return escape.terminal(text).replace("|", "\\|")


def _md(text: str) -> str:
    return escape.markdown(text)   # a reason may quote a model's output: text, never structure


def _e(value: Any) -> str:
    return escape.html(value)
