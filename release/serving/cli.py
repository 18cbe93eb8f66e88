"""Click commands `serve` and `bench`; the relctl CLI attaches them with `cli.add_command(...)`.

No logic here: parse options, call release.serving.api, print.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from release.errors import EXIT_INTERRUPTED, ReleaseError


@click.command("serve")
@click.argument("spec", metavar="MODEL@ALIAS|PACKAGE_DIR")
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: any free port)")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="release.yaml whose serving.server block replaces the package's server settings")
@click.option("--project-dir", type=click.Path(file_okay=False, path_type=Path), default=".",
              show_default=True, help="project folder: MLflow store, package cache and request logs")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write {url, pid, model, load_time_s} as JSON here once listening")
def serve_command(spec: str, host: str, port: int, config_path: Path | None, project_dir: Path,
                  ready_file: Path | None) -> None:
    """Serve a package (verified first) as an OpenAI-compatible API: /v1/completions,
    /v1/chat/completions, /v1/models, /health, /metrics. Ctrl-C or SIGTERM drains in-flight requests."""
    from release.serving.api import serve

    def announce(info: dict[str, Any]) -> None:
        click.echo(f"serving {info['model']} (serving config {info['serving_config']}) at {info['url']}; "
                   f"model loaded in {info['load_time_s']:.2f}s", err=True)

    serve(spec, host=host, port=port, project_dir=project_dir.resolve(), config_path=config_path,
          ready_file=ready_file, on_ready=announce)


@click.group("serving")
def serving_group() -> None:
    """Serving commands: serve a package, benchmark an endpoint."""


serving_group.add_command(serve_command)


def main() -> None:
    """Entry point of `python -m release.serving`: one-line errors and relctl's exit codes."""
    try:
        serving_group.main(standalone_mode=False)
    except ReleaseError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except (KeyboardInterrupt, click.Abort):
        sys.exit(EXIT_INTERRUPTED)
