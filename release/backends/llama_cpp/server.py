"""llama-server as relctl starts it: its command line, and one process on a private 127.0.0.1 port.

The argv is a plain function of the package and the slots wanted, so a deployment (KServe's container args,
release/backends/llama_cpp/deploy.py) and `relctl serve` start the same engine the same way:

- `--parallel N --kv-unified --ctx-size N x context`: N sequences decode at once (llama.cpp's own continuous
  batching) from one KV pool sized for N at the model's full context, so the pool is exactly the plan's
  (gguf_facts.kv_bytes_per_token x N x context);
- `--cache-ram 0`: no host-memory prompt cache beside the KV pool (its default is 8 GiB, which would make
  the process's memory depend on traffic rather than the plan);
- `--fit off`: the context is what relctl asks for, never shrunk to fit; `--no-webui`: an API, no UI.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from release.backends.base import ServerCommand
from release.backends.processes import engine_log_path
from release.core.errors import StageFailed
from release.core.subprocs import start_child, stop_child

START_TIMEOUT_ENV = "RELCTL_LLAMA_CPP_START_TIMEOUT_S"
THREADS_ENV = "RELCTL_LLAMA_CPP_THREADS"


def server_argv(server: Path, gguf: Path, served_name: str, host: str, port: int, slots: int,
                context: int) -> list[str]:
    argv = [str(server), "--model", str(gguf), "--alias", served_name, "--host", host, "--port", str(port),
            "--parallel", str(slots), "--kv-unified", "--ctx-size", str(slots * context),
            "--cache-ram", "0", "--fit", "off", "--no-webui"]
    threads = os.environ.get(THREADS_ENV)
    if threads:
        argv += ["--threads", threads]
    return argv


def log_path(label: str, port: int) -> Path:
    return engine_log_path("llama-cpp", label, port)



class ServerProcess:
    """One llama-server, ready when /health answers 200 (it answers 503 while the model loads)."""

    def __init__(self, command: ServerCommand, url: str, log: Path) -> None:
        self.command = command
        self.url = url
        self.log_path = log
        self.start_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        import httpx  # noqa: PLC0415 - choose_backend imports this package for every `relctl check`

        env = {**os.environ, **self.command.env}
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self._proc = start_child(self.command.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        _running.append(self)
        timeout = float(os.environ.get(START_TIMEOUT_ENV, "300"))
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise StageFailed(f"llama-server exited with {code} while starting: {self.log_tail()} "
                                  f"(log: {self.log_path})")
            try:
                if httpx.get(self.url + self.command.health_path, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > timeout:
                self.stop()
                raise StageFailed(f"llama-server not ready after {timeout:.0f}s (log: {self.log_path})",
                                  hint=f"{START_TIMEOUT_ENV} sets the limit")
            time.sleep(0.2)
        self.start_s = time.monotonic() - started
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def resident_bytes(self) -> int | None:
        """RSS of the server process (one process: llama-server spawns no workers); None if gone."""
        import psutil  # noqa: PLC0415 - only the memory measurement asks

        if self._proc is None:
            return None
        try:
            return int(psutil.Process(self._proc.pid).memory_info().rss)
        except psutil.Error:
            return None

    def log_tail(self) -> str:
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


_running: list[ServerProcess] = []


@atexit.register
def _stop_all() -> None:
    """A normal exit stops every server this process started (a killed one: start_child's death signal)."""
    for server in list(_running):
        server.stop()
