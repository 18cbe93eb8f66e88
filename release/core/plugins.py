"""Loading an entry-point plug-in (a backend, a gate) so that nothing it does at import changes a command.

A plug-in is third-party code that runs when it is imported. Whatever it does there — raise, call
`sys.exit()` (even `sys.exit(0)`: a command must never end "successfully" because a plug-in said so),
print to stdout (which `--json` output owns) — is contained here: the error is returned as one line naming
the entry point, and stdout written during the import goes to stderr. Ctrl-C and SIGTERM still interrupt.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint


class PluginBroken(Exception):
    """A plug-in whose import failed; `reason` is one line naming its entry point and its error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Python-level and fd-level stdout both go to stderr (a plug-in may print, or its C library write)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:   # no fd 1 (a daemon): the Python-level redirect is all there is to do
        saved = -1
    try:
        if saved >= 0:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def load_entry_point(ep: EntryPoint, kind: str) -> object:
    """`ep.load()`, isolated: PluginBroken("<kind> plug-in '<value>' failed to load: ...") for anything the
    import raises, SystemExit included; KeyboardInterrupt (Ctrl-C, relctl's SIGTERM) passes through."""
    try:
        with _stdout_to_stderr():
            return ep.load()
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        raise PluginBroken(f"{kind} plug-in '{ep.value}' failed to load: it called sys.exit({exc.code!r}) "
                           "at import") from None
    except BaseException as exc:   # any failure of third-party import code is the plug-in's
        first = (str(exc).splitlines() or [""])[0]
        raise PluginBroken(f"{kind} plug-in '{ep.value}' failed to load: {type(exc).__name__}: {first}") from exc
