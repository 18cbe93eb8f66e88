"""`python -m release.serving serve|bench ...`: the serving commands without the full relctl CLI
(used to run the server as a child process)."""

from __future__ import annotations

from release.core.subprocs import watch_parent
from release.serving.cli import main

# Started by release.core.subprocs.start_child (ServerProcess): stop (SIGTERM: drain) when the parent is gone.
watch_parent()
main()
