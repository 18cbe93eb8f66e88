"""Named pause points for crash tests: `RELCTL_PAUSE_AT=<name>` stops the process there.

The crash-matrix tests set RELCTL_PAUSE_AT and RELCTL_PAUSE_FILE, wait for the file to appear (the
process is now paused exactly at that point), SIGKILL it, and check that the next command recovers.
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
    if marker:
        Path(marker).write_text(f"{os.getpid()} {name}\n")
    while True:  # until the test kills us
        time.sleep(3600)
