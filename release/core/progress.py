"""One readable line per stage: a live spinner with elapsed time on a terminal, a heartbeat line every
`heartbeat_s` in CI logs (so a long stage never looks hung), nothing with --quiet."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

HEARTBEAT_S = 10.0
MARKS = {"pass": "[green]✓[/green]", "fail": "[red]✗[/red]", "skipped": "[dim]○[/dim]"}


class Progress:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.quiet = quiet
        self.heartbeat_s = heartbeat_s
        self.stream = stream

    @cached_property
    def console(self) -> Console:
        # Built on the first line printed: a quiet run (or one refused before any line) never imports rich.
        from rich.console import Console  # noqa: PLC0415 - ~0.1 s of start-up a refused `promote -q` skips

        # stderr, so `--json` output on stdout stays machine-readable.
        return Console(file=self.stream or sys.stderr, highlight=False, soft_wrap=True)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.quiet:
            yield
            return
        started = time.monotonic()
        stop = threading.Event()
        if self.console.is_terminal:
            with self.console.status(f"[bold]{name}[/bold] …") as status:
                ticker = threading.Thread(target=self._tick, args=(status, name, started, stop), daemon=True)
                ticker.start()
                try:
                    yield
                finally:
                    stop.set()
            return
        beat = threading.Thread(target=self._heartbeat, args=(name, started, stop), daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()

    def _tick(self, status: object, name: str, started: float, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            status.update(f"[bold]{name}[/bold] … {time.monotonic() - started:.0f}s")  # type: ignore[attr-defined]

    def _heartbeat(self, name: str, started: float, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            self.console.print(f"… {name:<12} still running, {time.monotonic() - started:.0f}s")

    def done(self, name: str, seconds: float, summary: str, skipped: bool = False, outcome: str = "pass") -> None:
        """A finished step. `outcome`: "pass" (✓), "fail" (✗: a gate that refused, never a green tick) or
        "skipped" (○: a gate that did not run)."""
        if self.quiet:
            return
        mark = "[dim]↺[/dim]" if skipped else MARKS.get(outcome, MARKS["pass"])
        note = " (resumed)" if skipped else ""
        self.console.print(f"{mark} {name:<12} {seconds:6.1f}s  {summary}{note}")

    def failed(self, name: str, summary: str) -> None:
        if not self.quiet:
            self.console.print(f"[red]✗[/red] {name:<12}         {summary}")

    def info(self, text: str) -> None:
        """A decision the reader should see on the progress, not a warning (the engine a release goes to)."""
        if not self.quiet:
            self.console.print(f"[cyan]→[/cyan] {text}")

    def note(self, text: str) -> None:
        """A line that is not a stage: a repair, a warning, a resumed leftover."""
        if not self.quiet:
            self.console.print(f"[yellow]![/yellow] {text}")
