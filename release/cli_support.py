"""Shared pieces of the CLI: the context object, one-line error mapping, JSON output."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from release.errors import EXIT_BUG, EXIT_INTERRUPTED, ReleaseError

F = TypeVar("F", bound=Callable[..., Any])


class Ctx:
    def __init__(self, project_dir: Path, show_traceback: bool, quiet: bool) -> None:
        self.project_dir = project_dir
        self.show_traceback = show_traceback
        self.quiet = quiet
        # Set by commands with --json, so a failure still prints its report as JSON.
        self.as_json = False


def _fail(ctx: Ctx, exc: BaseException) -> None:
    if isinstance(exc, ReleaseError):
        report = getattr(exc, "report", None)
        if ctx.as_json and report is not None:
            click.echo(json.dumps(report.to_dict(), indent=2, default=str))
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        if ctx.show_traceback:
            traceback.print_exception(exc)
        sys.exit(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        click.echo("error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    log_dir = ctx.project_dir / ".relctl" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"relctl-{datetime.now(UTC):%Y%m%dT%H%M%S}.log"
    log.write_text("".join(traceback.format_exception(exc)))
    click.echo(f"error: unexpected {type(exc).__name__}: {exc}".splitlines()[0], err=True)
    click.echo(f"hint: this is a relctl bug; the traceback is in {log} (or rerun with --traceback)", err=True)
    if ctx.show_traceback:
        traceback.print_exception(exc)
    sys.exit(EXIT_BUG)


def handled(fn: F) -> F:
    """Run a command body, turning every failure into one error line and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx: Ctx = click.get_current_context().find_object(Ctx)  # type: ignore[assignment]
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except (ReleaseError, KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - mapped to exit codes
            _fail(ctx, exc)

    return wrapper  # type: ignore[return-value]


def emit(data: Any, as_json: bool, text: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        text()


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")


