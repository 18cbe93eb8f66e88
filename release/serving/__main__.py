"""`python -m release.serving serve|bench ...`: the serving commands without the full relctl CLI
(used to run the server as a child process)."""

from __future__ import annotations

from release.serving.cli import main
from release.subprocs import watch_parent

# Started by release.subprocs.start_child (ServerProcess): stop (SIGTERM: drain) when the parent is gone.
watch_parent()
main()
