"""The one error policy: every exception relctl can meet, as a line, a hint and an exit code.

Both the CLI (what is printed, what the process returns) and the release report (what it records)
use `classify`, so they never disagree: Ctrl-C is 130 in both, SIGTERM 143, a relctl bug 3.
"""

from __future__ import annotations

import errno
import signal
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from release.core.errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_STAGE_FAILED, ReleaseError

EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it unwinds (and cleans up) exactly like Ctrl-C.

    Whoever unwinds something on the way out (the canary's version) sets `hint` to say what is left."""

    hint: str | None = None


@dataclass(frozen=True)
class Failure:
    message: str
    hint: str | None
    exit_code: int
    bug: bool = False


# Only promote keeps finished stages and resumes from them: its hints say so; every other command's say
# what is true for it (a hint belongs to the command that prints it).
RESUMABLE_COMMANDS = frozenset({"promote"})


def classify(exc: BaseException, resumable: bool = False) -> Failure:
    """`exc` as one line, a hint and an exit code; `resumable`: the command resumes (promote)."""
    if isinstance(exc, ReleaseError):
        return Failure(exc.message, exc.hint, exc.exit_code)
    if isinstance(exc, Terminated):
        return Failure("terminated (SIGTERM)", exc.hint or ("finished stages are kept; re-run the same command to "
                       "resume (the release report says what was registered)" if resumable else None), EXIT_TERMINATED)
    if isinstance(exc, KeyboardInterrupt):
        return Failure("interrupted", "finished stages are kept; re-run the same command to resume" if resumable
                       else None, EXIT_INTERRUPTED)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Failure(f"out of disk space: {exc}", "free space under the project's .relctl/ folder", EXIT_STAGE_FAILED)
    if _unreachable_registry(exc):
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return Failure(f"the registry failed: {first}", "check that the tracking server is up, then run the command "
                       "again" + (" (finished stages are kept)" if resumable else ""), EXIT_STAGE_FAILED)
    first = (f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__])[0]
    return Failure(f"unexpected {first}", None, EXIT_BUG, bug=True)


def _unreachable_registry(exc: BaseException) -> bool:
    """An MLflow call that failed on the network (requests' errors are OSErrors) wherever it was made:
    an infrastructure failure (exit 4), not a relctl bug, even where no RegistryError wraps it."""
    if not type(exc).__module__.startswith("mlflow."):
        return False
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def write_log(exc: BaseException, log_dir: Path) -> Path:
    """The full traceback in `log_dir`, for a bug report."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"relctl-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.log"
    log.write_text("".join(traceback.format_exception(exc)))
    return log


def raise_on_sigterm() -> None:
    """Turn SIGTERM into Terminated in the main thread (servers install their own drain handler)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
