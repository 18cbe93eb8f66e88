"""Click commands `serve` and `bench`; the relctl CLI attaches them with `cli.add_command(...)`.

No logic here: parse options, call release.serving.api, print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from release.commands.support import handled
from release.serving.loadgen.cli import bench_command


def _relctl_ctx() -> Any:
    """The relctl group's context object when these commands run under `relctl`, else None."""
    from release.commands.support import Ctx

    return click.get_current_context().find_object(Ctx)


# One error policy for every command (release.pipeline.failure): under `relctl` and standalone alike.
_handled = handled


def _project_dir(option: Path | None) -> Path:
    """--project-dir, else the relctl group's project folder, else the current directory."""
    if option is not None:
        return option.resolve()
    ctx = _relctl_ctx()
    return Path(ctx.project_dir if ctx is not None else ".").resolve()


@click.command("serve")
@click.argument("spec", metavar="MODEL@ALIAS|MODEL/VERSION|models:/MODEL/VERSION|PACKAGE_DIR")
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: any free port)")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="release.yaml whose serving.server block replaces the package's server settings")
@click.option("--project-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="project folder: MLflow store, package cache and request logs [default: relctl's, else .]")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write {url, pid, model, load_time_s} as JSON here once listening")
@click.option("--api-key", envvar="RELCTL_API_KEY", default=None, show_envvar=True,
              help="require 'Authorization: Bearer KEY' on every path but /health and /admin/* (prefer the "
                   "variable: a command line is visible to other users)")
@click.option("--served-model-name", default=None,
              help="model id clients see in /v1/models and send as 'model' [default: MODEL:VERSION]")
@click.option("--cached-only", is_flag=True,
              help="serve a registered version only from the serve cache, where a ModelCar or an init container "
                   "put it: a missing or changed file is refused (exit 2), never downloaded again")
@click.option("--adapters", is_flag=True,
              help="serve the base's production LoRA adapters beside it (the 'model' field names one) and "
                   "accept /admin/adapters loads and unloads (with --admin-key); docs/adapters.md")
@click.option("--adapter-package", "adapter_packages", multiple=True, metavar="MODEL[/VERSION]=DIR",
              help="serve this adapter package folder (verified, and checked to be bound to the base) instead of "
                   "the registry's production adapters; repeatable; implies --adapters (a pod's pinned adapters)")
@click.option("--admin-key", envvar="RELCTL_ADMIN_KEY", default=None, show_envvar=True,
              help="the one key /admin/* accepts (adapter switches), never a completions key; without it the "
                   "admin paths are refused (prefer the variable)")
@click.option("--follow-interval", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="SECONDS",
              help="with --adapters: read the registry this often and switch each adapter to its production version "
                   "when that moves (promote --onto, rollback, approve); the server records itself in the registry "
                   "for relctl status. 0: switch only by /admin requests. Not with --adapter-package (the pod "
                   "serves exactly those)")
@_handled
def serve_command(spec: str, host: str, port: int, config_path: Path | None, project_dir: Path | None,
                  ready_file: Path | None, api_key: str | None, served_model_name: str | None,
                  cached_only: bool, adapters: bool, adapter_packages: tuple[str, ...], admin_key: str | None,
                  follow_interval: float) -> None:
    """Serve a package (verified first) as an OpenAI-compatible API: /v1/completions,
    /v1/chat/completions, /v1/models, /health, /metrics, /openapi.json. Ctrl-C or SIGTERM drains
    in-flight requests."""
    from release.serving.api import serve

    def announce(info: dict[str, Any]) -> None:
        click.echo(f"serving {info['model']} (serving config {info['serving_config']}) at {info['url']}; "
                   f"model loaded in {info['load_time_s']:.2f}s", err=True)

    serve(spec, host=host, port=port, project_dir=_project_dir(project_dir), config_path=config_path,
          ready_file=ready_file, on_ready=announce, api_key=api_key, served_model_name=served_model_name,
          cached_only=cached_only, adapters=adapters, admin_key=admin_key, adapter_packages=adapter_packages,
          follow_interval=follow_interval)


@click.group("serving")
def serving_group() -> None:
    """Serving commands: serve a package, benchmark an endpoint."""


serving_group.add_command(serve_command)
serving_group.add_command(bench_command)  # release/serving/loadgen/cli.py


def main() -> None:
    """Entry point of `python -m release.serving`: the same one-line errors and exit codes as relctl."""
    serving_group(prog_name="python -m release.serving")
