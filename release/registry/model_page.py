"""The registered model's description: its aliases now and its alias history as tables a reviewer reads.

The history itself lives in `relctl.history.*` tags (aliases.py), which the MLflow UI shows as raw JSON;
this page is rewritten from them after every move, so it is a view and never the record.
"""

from __future__ import annotations

from release.core.escape import markdown
from release.registry import links
from release.registry.aliases import AliasMove

SHOWN = 20
INTRO = "Served by relctl. Versions are promoted from training runs; `production` is the version that serves."


def model_page(name: str, aliases: dict[str, str], history: list[AliasMove], tracking_uri: str,
               releases_experiment: str) -> str:
    """Markdown for registered model `name`: aliases with links, then the newest moves first."""

    def version(v: str | None) -> str:
        return f"[v{v}]({links.version_link(tracking_uri, name, v)})" if v else "—"

    lines = [INTRO, "", "## Aliases", "| alias | version |", "|---|---|"]
    lines += [f"| `{alias}` | {version(v)} |" for alias, v in sorted(aliases.items())] or ["| — | — |"]
    lines += ["", f"## Alias history (newest first; `relctl history {name}` lists all {len(history)})",
              "| when (UTC) | action | changes | reason | by | release run |", "|---|---|---|---|---|---|"]
    for move in reversed(history[-SHOWN:]):
        changes = ", ".join(f"`{alias}` {version(old)} → {version(new)}"
                            for alias, (old, new) in sorted(move.changes.items())) or "—"
        run = (f"[{move.release_run[:8]}]({links.run_link(tracking_uri, releases_experiment, move.release_run)})"
               if move.release_run else "—")
        lines.append(f"| {move.at[:19].replace('T', ' ')} | {move.action} | {changes} | {_cell(move.reason)} | "
                     f"{_cell(move.user)} | {run} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    # A reason is free text from a user or a gate: one escaped line (release/core/escape.py), so it keeps the
    # table a table and adds no row, link, image or HTML to the registry page.
    return markdown(text[:300])
