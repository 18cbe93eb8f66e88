"""`relctl gate <id> <package>`: run one gate on a package, outside a promote run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from release.commands.support import Ctx, emit, handled, json_option
from release.core.errors import EXIT_BLOCKED
from release.gating.contract import blocks


@click.command("gate")
@click.argument("gate_id")
@click.argument("package_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="release.yaml whose gates.<id> block configures the gate, relative to PROJECT_DIR unless absolute "
                   "(default: PROJECT_DIR/release.yaml).")
@click.option("--eval-dataset", type=click.Path(dir_okay=False, path_type=Path),
              help="Eval set JSONL for gates that need one (overridden by gates.eval.dataset).")
@click.option("--baseline", "baseline_dir", type=click.Path(file_okay=False, path_type=Path),
              help="A package to compare against as if it were production (no-regression checks).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for evidence and the HTML report (default: PROJECT_DIR/.relctl/gate-runs/<id>).")
@json_option
@click.pass_obj
@handled
def gate(ctx: Ctx, gate_id: str, package_dir: Path, config_path: Path | None, eval_dataset: Path | None,
         baseline_dir: Path | None, out_dir: Path | None, as_json: bool) -> None:
    """Run gate GATE_ID on PACKAGE_DIR; exit 0 on pass or skipped, 1 on fail or underpowered, 2 on bad input."""
    from release.config import config_path as resolve_config
    from release.core.outputs import check_new_folder
    from release.gating.report import render_html, render_markdown, result_to_dict
    from release.gating.standalone import run_standalone

    ctx.as_json = as_json
    work = out_dir or ctx.project_dir / ".relctl" / "gate-runs" / gate_id
    if out_dir is not None:   # evidence is rewritten in place: a new folder, or one an earlier `relctl gate` wrote
        check_new_folder(out_dir, "--out", reusable=lambda folder: (folder / "report.html").is_file())
    result = run_standalone(gate_id, package_dir, work, resolve_config(ctx.project_dir, config_path),
                            eval_dataset, baseline_dir)
    baseline = f"baseline:{baseline_dir.name}" if baseline_dir else None
    html = work / "report.html"
    html.write_text(render_html([result], {"package": str(package_dir), "baseline": baseline or "none"}))
    data = {**result_to_dict(result), "report": str(html)}
    emit(data, as_json, lambda: click.echo(render_markdown([result], baseline) + f"\nreport: {html}"))
    if blocks(result.status):  # fail, underpowered: the gate did not pass
        sys.exit(EXIT_BLOCKED)
