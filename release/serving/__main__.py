"""`python -m release.serving serve|bench ...`: the serving commands without the full relctl CLI
(used to run the server as a child process)."""

from __future__ import annotations

from release.serving.cli import main

main()
