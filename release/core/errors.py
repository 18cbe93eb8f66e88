"""Errors that reach the user as one line, each with the exit code CI acts on.

Exit codes (one meaning each): 0 released, 1 a gate or validation blocked the release,
2 bad usage, config or input, 3 unexpected bug, 4 a stage or the registry failed, 130 interrupted.
"""

from __future__ import annotations

from typing import Any

EXIT_RELEASED = 0
EXIT_BLOCKED = 1
EXIT_BAD_INPUT = 2
EXIT_BUG = 3
EXIT_STAGE_FAILED = 4
EXIT_INTERRUPTED = 130


class ReleaseError(Exception):
    """Base of every error relctl reports as one line (`error: ...` + optional `hint: ...`)."""

    exit_code: int = EXIT_STAGE_FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # A promote that fails after it started attaches its ReleaseReport, so --json can print it.
        self.report: Any = None


class InputError(ReleaseError):
    """The user's input is wrong: run id, checkpoint, adapter, release.yaml, a data file."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """release.yaml (or a CLI option) is invalid."""


class Blocked(ReleaseError):
    """Validation or a gate refused the candidate. The report is still written."""

    exit_code = EXIT_BLOCKED


class StageFailed(ReleaseError):
    """A stage could not complete for reasons other than bad input (tooling, disk, runtime)."""

    exit_code = EXIT_STAGE_FAILED


class RegistryError(ReleaseError):
    """MLflow could not be read or written."""

    exit_code = EXIT_STAGE_FAILED


class InputProblems(InputError):
    """Several things wrong with the input at once: each is printed as its own error and hint line."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        first, hint = problems[0]
        super().__init__(first if len(problems) == 1 else f"{first} (and {len(problems) - 1} more)", hint)
        self.problems = problems
