"""What every engine that runs as its own server process needs from relctl: a free loopback port, a log file
outside any package, and the process itself (`EngineServer`: started, awaited until healthy, measured, stopped
with the relctl process that needs it). Shared by the built-in engines and open to plug-ins: an engine's
package subclasses EngineServer with its name, start-up timeout and environment rules.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from release.backends.base import ServerCommand
from release.core.errors import StageFailed
from release.core.subprocs import start_child, stop_child


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


class EngineServer:
    """One engine server on a private 127.0.0.1 port, ready when its health path answers 200.

    Started with release.core.subprocs.start_child, so the server (and any process it spawns, in its own
    process group) dies with the relctl process that needs it; a normal exit stops it too (atexit)."""

    name: ClassVar[str] = "engine"                  # how errors name the engine ("vLLM", "llama-server")
    start_timeout_env: ClassVar[str | None] = None  # the variable that overrides start_timeout_s
    start_timeout_s: ClassVar[float] = 300.0
    poll_s: ClassVar[float] = 0.2
    # What the engine must not inherit from relctl's environment (e.g. an engine with its own interpreter).
    not_inherited: ClassVar[tuple[str, ...]] = ()

    def __init__(self, command: ServerCommand, url: str, log_path: Path) -> None:
        self.command = command
        self.url = url
        self.log_path = log_path
        self.start_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        # Imported here: choose_backend loads the engines' packages for every `relctl check`/`promote`, which
        # then paid ~0.25 s for httpx before refusing a run.
        import httpx  # noqa: PLC0415

        env = {k: v for k, v in os.environ.items() if k not in self.not_inherited}
        env.update(self.command.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self._proc = start_child(self.command.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        _running.append(self)
        timeout = self._timeout()
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise StageFailed(f"{self.name} exited with {code} while starting: {self.log_tail()} "
                                  f"(log: {self.log_path})")
            try:
                if httpx.get(self.url + self.command.health_path, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > timeout:
                self.stop()
                raise StageFailed(f"{self.name} not ready after {timeout:.0f}s (log: {self.log_path})",
                                  hint=f"{self.start_timeout_env} sets the limit" if self.start_timeout_env else None)
            time.sleep(self.poll_s)
        self.start_s = time.monotonic() - started
        return self

    def _timeout(self) -> float:
        raw = os.environ.get(self.start_timeout_env) if self.start_timeout_env else None
        return float(raw) if raw else self.start_timeout_s

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def resident_bytes(self) -> int | None:
        """RSS of the server and every process it spawned (vLLM: API server, engine core, worker; llama-server:
        itself alone); None if gone."""
        import psutil  # noqa: PLC0415 - only the memory measurement asks

        proc = self._proc
        if proc is None:
            return None
        try:
            root = psutil.Process(proc.pid)
            return sum(int(p.memory_info().rss) for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return None

    def log_tail(self) -> str:
        """The last line of the log that names an error, else its last line."""
        lines = self.log_path.read_text(errors="replace").strip().splitlines() if self.log_path.is_file() else []
        errors = [line for line in lines if "error" in line.lower()]
        return (errors or lines or ["(no output)"])[-1][:300]

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc, 30.0)
        if self in _running:
            _running.remove(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


_running: list[EngineServer] = []


@atexit.register
def _stop_all() -> None:
    """A normal exit stops every server this process started (a killed one: start_child's death signal)."""
    for server in list(_running):
        server.stop()
