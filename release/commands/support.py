"""Shared pieces of the CLI: the context object, the one failure handler, JSON output."""

from __future__ import annotations

import errno
import json
import os
import select
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import wraps
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from release.pipeline.failure import RESUMABLE_COMMANDS, classify, write_log

F = TypeVar("F", bound=Callable[..., Any])


class Ctx:
    def __init__(self, project_dir: Path, show_traceback: bool, quiet: bool) -> None:
        self.project_dir = project_dir
        self.show_traceback = show_traceback
        self.quiet = quiet
        # Set by commands with --json, so a failure still prints its report as JSON.
        self.as_json = False


def current_ctx() -> Ctx:
    """The relctl group's context, or a default one when a command runs outside the group."""
    found = click.get_current_context(silent=True)
    ctx = found.find_object(Ctx) if found is not None else None
    return ctx if ctx is not None else Ctx(Path(".").resolve(), show_traceback=False, quiet=False)


def stdout_closed(exc: BaseException) -> bool:
    """`exc` is a write to a stdout whose reader went away (`relctl plan ... | head`), not a socket's EPIPE:
    poll() reports an error on the write end of a pipe once its read end is closed."""
    if not isinstance(exc, OSError) or exc.errno != errno.EPIPE:
        return False
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
    except (OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def leave_quietly() -> NoReturn:
    """Exit 0 without a word, as git does when its pager or `head` stops reading. stdout is pointed at
    /dev/null first, so the interpreter's last flush of what is still buffered cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
    os.close(devnull)
    sys.exit(0)


@contextmanager
def quiet_on_closed_stdout() -> Iterator[None]:
    """Every command's output may go into a pipe that closes early: that is the reader's choice, not an
    error (click alone would exit 1, and relctl's error funnel would call it a bug, exit 3)."""
    try:
        yield
    except OSError as exc:
        if stdout_closed(exc):
            leave_quietly()
        raise


def fail(ctx: Ctx, exc: BaseException) -> None:
    """Print one `error:` line and a `hint:` line for `exc` and exit with its code (release.pipeline.failure)."""
    command = click.get_current_context(silent=True)
    failure = classify(exc, resumable=command is not None and command.info_name in RESUMABLE_COMMANDS)
    report = getattr(exc, "report", None)
    if ctx.as_json and report is not None:
        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
    problems = getattr(exc, "problems", None)
    if problems:  # every problem at once, each with its fix
        for message, fix in problems[:-1]:
            click.echo(f"error: {message}", err=True)
            click.echo(f"hint: {fix}", err=True)
        failure = replace(failure, message=problems[-1][0], hint=problems[-1][1])
    click.echo(f"error: {failure.message}", err=True)
    hint = failure.hint
    if failure.bug:
        log = write_log(exc, ctx.project_dir / ".relctl" / "logs")
        hint = f"this is a relctl bug; the traceback is in {log} (or rerun with --traceback)"
    if hint:
        click.echo(f"hint: {hint}", err=True)
    if ctx.show_traceback:
        traceback.print_exception(exc)
    sys.exit(failure.exit_code)


def handled(fn: F) -> F:
    """Run a command body, turning every failure into one error line and its exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit):
            raise
        except BaseException as exc:
            if isinstance(exc, SystemExit):
                raise
            if stdout_closed(exc):
                leave_quietly()
            fail(current_ctx(), exc)

    return wrapper  # type: ignore[return-value]


def emit(data: Any, as_json: bool, text: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        text()


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
