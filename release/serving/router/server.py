"""Run a Router on 127.0.0.1 in a background thread (its own event loop), for in-process control:
the canary runner changes weights between checks without an HTTP round trip."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Self

import uvicorn

from release.core.errors import StageFailed
from release.serving.loadgen.client import run_async
from release.serving.router.app import Router


class RouterServer:
    """Context manager: uvicorn serving `router` on a free port; `url` once started."""

    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0) -> None:
        self.router = router
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def start(self) -> Self:
        config = uvicorn.Config(self.router, host=self.host, port=self.port, lifespan="on", log_level="warning",
                                access_log=False, timeout_keep_alive=30, backlog=4096)
        self._server = uvicorn.Server(config)
        # uvicorn installs signal handlers only in the main thread; in this thread it must not try.
        self._server.install_signal_handlers = lambda: None
        self._thread = threading.Thread(target=self._run, name="relctl-router", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if self._failure is not None or not self._thread.is_alive():
                raise StageFailed(f"router: could not start on {self.host}:{self.port}: {self._failure}")
            if time.monotonic() > deadline:
                raise StageFailed(f"router: not listening after {self.start_timeout_s:.0f}s")
            time.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def _run(self) -> None:
        try:
            run_async(self._server.serve())
        except BaseException as exc:  # reported by start() in the caller's thread
            self._failure = exc

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop accepting, let in-flight requests and shadow copies finish, then return."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
