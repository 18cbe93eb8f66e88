from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def backend() -> Iterator[str]:
    """tests/canary/backend.py in its own process (one server simulates every backend); its base URL."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        proc = subprocess.Popen([sys.executable, "-m", "tests.canary.backend", "--ready-file", str(ready)])
        try:
            deadline = time.monotonic() + 60
            while not ready.is_file():
                assert proc.poll() is None and time.monotonic() < deadline, "canary test backend did not start"
                time.sleep(0.05)
            yield str(json.loads(ready.read_text())["url"])
        finally:
            proc.terminate()
            proc.wait(30)
