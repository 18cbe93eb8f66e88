"""Run the app: in the foreground with uvicorn (SIGTERM drains in-flight streams, then exits 0),
or as a child process other code drives (the load gate, tests, benchmarks)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn

from release.core.errors import InputError
from release.core.server_settings import ServerSettings
from release.registry.store import STATE_DIR
from release.serving.app import ServerState, create_app
from release.serving.engine import open_engine
from release.serving.metrics import ServerMetrics
from release.serving.requestlog import RequestLog
from release.serving.source import ServedPackage


def package_settings(package: ServedPackage) -> ServerSettings:
    """The server settings the package was built with (serving.server in its manifest), else defaults."""
    serving = package.manifest.data.get("serving") or {}
    block = serving.get("server", {}) if isinstance(serving, dict) else {}
    try:
        return ServerSettings.model_validate(block)
    except ValueError as exc:
        raise InputError(f"{package.manifest.root.name}: invalid serving.server in its manifest",
                         hint="rebuild the package with a valid release.yaml") from exc


def load_state(package: ServedPackage, settings: ServerSettings, project_dir: Path,
               adapters: Mapping[str, Path] | None = None) -> ServerState:
    """Load the model (timed) and wire metrics and the request log. `adapters`: serve LoRA adapters beside
    it, these loaded (engine name: folder)."""
    engine = open_engine(package.manifest, settings, adapters)
    policy = settings.request_log
    log_dir = Path(policy.directory) if policy.directory else project_dir / STATE_DIR / "request-logs"
    metrics = ServerMetrics(package.identity, engine.load_time_s, lambda: engine.queue_depth,
                            lambda: engine.in_flight, lambda: engine.batching)
    return ServerState(engine, package.identity, metrics, RequestLog(policy, log_dir))


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's socket, bound now: `relctl serve` takes its port before it verifies and loads the model, so
    a busy port is exit 2 in a second naming the port (not a traceback after a minute's load)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise InputError(f"--host {host}: {exc.strerror}", hint="give an address of this machine, e.g. 127.0.0.1 "
                         "or 0.0.0.0") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        sock.bind(address)
        sock.listen(2048)   # listening holds the port (two bound-only SO_REUSEADDR sockets could share it)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} on {host} is already in use (another server listens there)",
                             hint="pick a free one with --port (0: any free port), or stop what listens there") from exc
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}",
                         hint="pick another --port (ports below 1024 need privileges) or --host") from exc
    return sock


def run_server(state: ServerState, host: str, port: int, ready_file: Path | None = None,
               on_ready: Any = None, sock: socket.socket | None = None) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let in-flight requests finish, and return. `sock`: the
    listener bind_listener took (host and port are then only what it was bound to)."""

    config = uvicorn.Config(
        create_app(state), host=host, port=port, lifespan="on", log_level="warning", access_log=False,
        timeout_graceful_shutdown=int(state.engine.settings.shutdown_grace_s) or None,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    _log_to_stderr()
    # uvicorn re-raises a captured SIGTERM after its graceful shutdown; with this handler in place the
    # re-raise only records it, so a drained server exits 0 (a normal stop) instead of dying by the signal.
    stopped_by: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _: stopped_by.append(signum))
    try:
        asyncio.run(_serve(server, state, ready_file, on_ready, sock))
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped_by:
        left = state.engine.in_flight
        outcome = "every in-flight request finished" if left == 0 else (
            f"{left} requests cut off after the {state.engine.settings.shutdown_grace_s:.0f}s shutdown grace")
        sys.stderr.write(f"relctl serve: stopped by SIGTERM; {outcome}\n")
        sys.stderr.flush()


def _log_to_stderr() -> None:
    """Server faults (logged with their request id) go to stderr, once, however often a server starts."""
    logger = logging.getLogger("relctl.serve")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("relctl serve: %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


async def _serve(server: Any, state: ServerState, ready_file: Path | None, on_ready: Any,
                 sock: socket.socket | None = None) -> None:
    task = asyncio.create_task(server.serve(sockets=[sock] if sock is not None else None))
    while not server.started:
        if task.done():
            await task
            raise InputError("server: could not start listening", hint="is the port already in use?")
        await asyncio.sleep(0.02)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    info = {"url": f"http://{host}:{port}", "pid": os.getpid(), "model": state.identity.model_id,
            "serving_config": state.identity.serving_config, "load_time_s": state.engine.load_time_s}
    if ready_file is not None:
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(json.dumps(info))
        tmp.rename(ready_file)
    if on_ready is not None:
        on_ready(info)
    await task
