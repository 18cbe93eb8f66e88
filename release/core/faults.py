"""Named pause points for crash and race tests: `RELCTL_PAUSE_AT=<name>` stops the process there.

With RELCTL_PAUSE_AT and RELCTL_PAUSE_FILE set, the process writes the file when it reaches that point
and waits there until the file is removed (then it goes on) or the process is killed. The crash-matrix
tests SIGKILL it while it waits; the race tests act meanwhile (a rollback) and then let it go on.
Unset (always, outside those tests), a pause point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def pause_point(name: str) -> None:
    if os.environ.get("RELCTL_PAUSE_AT") != name:
        return
    marker = os.environ.get("RELCTL_PAUSE_FILE")
    if not marker:
        return
    path = Path(marker)
    path.write_text(f"{os.getpid()} {name}\n")
    while path.exists():
        time.sleep(0.05)
