"""A hint belongs to the command that prints it: only promote resumes from finished stages, so only its
SIGTERM, Ctrl-C and registry-failure hints say "re-run the same command to resume"."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from release.commands.support import handled
from release.pipeline.failure import Terminated


def command_named(name: str, exc: BaseException) -> click.Command:
    @click.command(name)
    @handled
    def body() -> None:
        raise exc

    return body


@pytest.mark.parametrize("exc", [Terminated(), KeyboardInterrupt()], ids=["sigterm", "ctrl-c"])
@pytest.mark.parametrize("name", ["pull", "webhook", "convert", "rollback"])
def test_only_promote_says_resume(name: str, exc: BaseException) -> None:
    other = CliRunner().invoke(command_named(name, exc))
    assert other.exit_code in (130, 143), other.output
    assert "resume" not in other.stderr and "finished stages" not in other.stderr
    promote = CliRunner().invoke(command_named("promote", exc))
    assert promote.exit_code == other.exit_code
    assert "re-run the same command to resume" in promote.stderr
