"""`relctl init`: the command; the project it writes is release/commands/init.py's."""

from __future__ import annotations

import os
from pathlib import Path

import click

from release.commands.init import init_project, relctl_source
from release.commands.support import Ctx, emit, handled, json_option


@click.command("init")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite starter files that already exist.")
@json_option
@click.pass_obj
@handled
def init_command(ctx: Ctx, directory: Path | None, force: bool, as_json: bool) -> None:
    """Start a relctl project in DIRECTORY (default: --project-dir): release.yaml with every key and its
    default, the GitHub promote workflow, KServe manifest and Dockerfiles, and .relctl/ in .gitignore."""
    ctx.as_json = as_json
    target = (directory or ctx.project_dir).resolve()
    result = init_project(target, force=force, source=relctl_source())

    def text() -> None:
        for rel in result.written:
            click.echo(f"wrote {rel}")
        click.echo(f".gitignore: {result.gitignore}")
        if "MLFLOW_TRACKING_URI" in os.environ:
            click.echo("runs: relctl reads the MLFLOW_TRACKING_URI already set; log your training runs there")
        else:
            click.echo("runs: log your training runs where relctl reads them; in the shell that trains, run")
            click.echo(f"  {result.tracking_export}")
        if result.relctl_source is None:
            click.echo("next: set RELCTL_SOURCE in .github/workflows/promote.yml to where relctl installs from "
                       "(e.g. git+https://github.com/ORG/relctl@v0.1.0), and the repository secrets "
                       "MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN")
        else:
            click.echo("next: set the repository secrets MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN")

    emit(result.__dict__, as_json, text)
