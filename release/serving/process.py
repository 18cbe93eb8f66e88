"""A `relctl serve` child process: started on a free port of 127.0.0.1, ready when it has loaded the
model and is listening, stopped with SIGTERM (graceful: in-flight requests finish). It dies with its
parent however the parent ends, SIGKILL included (release.core.subprocs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from release.core.errors import StageFailed
from release.core.jsonfile import load_json_object
from release.core.subprocs import start_child, stop_child


class ServerProcess:
    """Context manager around `python -m release.serving serve SPEC --port 0` in `work_dir`."""

    def __init__(self, spec: str, work_dir: Path, config: Path | None = None, project_dir: Path | None = None,
                 start_timeout_s: float = 600.0, api_key: str | None = None,
                 served_model_name: str | None = None, admin_key: str | None = None) -> None:
        self.spec = spec
        self.api_key = api_key
        self.admin_key = admin_key
        self.served_model_name = served_model_name
        self.work_dir = work_dir
        self.config = config
        self.project_dir = project_dir or work_dir
        self.start_timeout_s = start_timeout_s
        self.info: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return str(self.info["url"])

    def start(self) -> Self:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        ready = self.work_dir / "server-ready.json"
        ready.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "release.serving", "serve", self.spec, "--host", "127.0.0.1", "--port", "0",
               "--ready-file", str(ready), "--project-dir", str(self.project_dir)]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        if self.served_model_name is not None:
            cmd += ["--served-model-name", self.served_model_name]
        # The keys travel in the environment, never on a command line that `ps` shows; a child server never
        # inherits either from this process.
        env = {k: v for k, v in os.environ.items() if k not in ("RELCTL_API_KEY", "RELCTL_ADMIN_KEY")}
        for name, key in (("RELCTL_API_KEY", self.api_key), ("RELCTL_ADMIN_KEY", self.admin_key)):
            if key is not None:
                env[name] = key
        log = (self.work_dir / "server.log").open("wb")
        try:
            self._proc = start_child(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while not ready.is_file():
            if self._proc.poll() is not None:
                raise StageFailed(f"relctl serve {self.spec}: exited with {self._proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise StageFailed(f"relctl serve {self.spec}: not ready after {self.start_timeout_s:.0f}s")
            time.sleep(0.05)
        self.info = load_json_object(ready, hint="a relctl serve of another version wrote it; upgrade both",
                                     label=f"relctl serve {self.spec}: {ready.name}")
        httpx.get(f"{self.url}/health", timeout=10).raise_for_status()
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, then wait for the drain; kill only if it does not exit within `timeout_s`."""
        proc = self._proc
        if proc is None:
            return None
        return stop_child(proc, timeout_s)

    def _log_tail(self) -> str:
        path = self.work_dir / "server.log"
        lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
        return lines[-1] if lines else "(no output)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
