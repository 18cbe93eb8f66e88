"""One readable line per stage: a spinner on a terminal, plain lines in CI logs, nothing with --quiet."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console


class Progress:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        # stderr, so `--json` output on stdout stays machine-readable.
        self.console = Console(file=stream or sys.stderr, highlight=False, soft_wrap=True)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.quiet or not self.console.is_terminal:
            yield
            return
        with self.console.status(f"[bold]{name}[/bold] …"):
            yield

    def done(self, name: str, seconds: float, summary: str, skipped: bool = False) -> None:
        if self.quiet:
            return
        mark = "[dim]↺[/dim]" if skipped else "[green]✓[/green]"
        note = " (resumed)" if skipped else ""
        self.console.print(f"{mark} {name:<12} {seconds:6.1f}s  {summary}{note}")

    def failed(self, name: str, summary: str) -> None:
        if not self.quiet:
            self.console.print(f"[red]✗[/red] {name:<12}         {summary}")

    def note(self, text: str) -> None:
        """A line that is not a stage: a repair, a warning, a resumed leftover."""
        if not self.quiet:
            self.console.print(f"[yellow]![/yellow] {text}")
