"""What every engine that runs as its own server process needs from relctl: a free loopback port and a log file
outside any package. Shared by the built-in engines and open to plug-ins (it imports nothing of relctl's)."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path


def engine_log_path(engine: str, label: str, port: int) -> Path:
    """Where an engine's output goes: never inside a package (verify refuses files added to one)."""
    folder = Path(tempfile.gettempdir()) / f"relctl-{engine}-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{label}-{os.getpid()}-{port}.log"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
