"""The library entry point behind `relctl serve` (the CLI only parses and calls it)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.config import load_config
from release.core.errors import InputError
from release.core.server_settings import ServerSettings
from release.serving.follow import DEFAULT_INTERVAL_S, Follower, Table
from release.serving.server import load_state, package_settings, run_server
from release.serving.source import UNREGISTERED, ServedPackage, resolve_package

if TYPE_CHECKING:
    from release.adapters.serving import AdapterSetup


def serve(spec: str, *, host: str = "127.0.0.1", port: int = 8000, project_dir: Path,
          config_path: Path | None = None, ready_file: Path | None = None,
          on_ready: Callable[[dict[str, Any]], None] | None = None, api_key: str | None = None,
          served_model_name: str | None = None, cached_only: bool = False, adapters: bool = False,
          follow_interval: float = DEFAULT_INTERVAL_S) -> None:
    """Verify and load `spec` and serve it until SIGINT/SIGTERM. `spec`: a package folder, MODEL@ALIAS,
    MODEL/VERSION, models:/MODEL@ALIAS or models:/MODEL/VERSION (release.serving.source).

    Settings: `serving.server` of `config_path` (release.yaml) when given, else the package's own.
    `api_key`: required as `Authorization: Bearer <key>` on every path but /health. `served_model_name`:
    the model id clients see and send (default `<model>:<version>`; the X-Relctl-* headers always name
    the registered version). `cached_only`: a registered version only from the serve cache (see
    release.serving.source.resolve_package). `on_ready` receives {url, pid, model, serving_config, load_time_s}.
    `adapters`: serve the base's production LoRA adapters beside it (the `model` field names one) and
    let /admin/adapters load and unload them at run time (docs/adapters.md); the server then follows its
    adapters' production aliases, reading the registry every `follow_interval` seconds (0: it only records
    itself), and records itself in the registry (release/serving/follow.py).
    """
    if api_key is not None and not api_key.strip():
        raise InputError("--api-key: empty", hint="pass a non-empty key, or leave the option and RELCTL_API_KEY unset")
    package = resolve_package(spec, project_dir, cached_only=cached_only)
    settings = _settings(config_path) if config_path is not None else package_settings(package)
    follower = None
    if adapters:
        from release.adapters.bound import bound_fetch  # noqa: PLC0415 - only a server of adapters
        from release.adapters.serving import AdapterTable  # noqa: PLC0415 - as above

        setup = base_adapters(package, project_dir)
        state = load_state(package, settings, project_dir, setup.folders)
        ident = package.identity
        table = AdapterTable(state.engine.runner,  # type: ignore[arg-type]
                             bound_fetch(setup.fetch, ident.name, ident.version))
        for served in setup.served:
            table.adopt(served)
        state.adapters = table
        follower = registry_follower(project_dir, table, ident.name, ident.version, follow_interval)
    else:
        state = load_state(package, settings, project_dir)
    state.api_key = api_key
    state.served_name = served_model_name or ""

    def ready(info: dict[str, Any]) -> None:
        if follower is not None:  # listening: its URL is known, so it records itself and starts to follow
            follower.start(info["url"], socket.gethostname(), int(info["pid"]))
        if on_ready is not None:
            on_ready(info)

    try:
        run_server(state, host, port, ready_file=ready_file, on_ready=ready)
    finally:
        if follower is not None:
            follower.stop()


def registry_follower(project_dir: Path, table: Table, base_model: str, base_version: str,
                      interval_s: float) -> Follower:
    """The watch on the adapters' production aliases, on its own registry client (its own thread)."""
    from release.registry.client import open_registry  # noqa: PLC0415 - only a server of adapters

    return Follower(open_registry(project_dir), table, base_model, base_version, interval_s)


def base_adapters(package: ServedPackage, project_dir: Path) -> AdapterSetup:
    """The production adapters of the registered base `package` serves (InputError for a package folder)."""
    from release.adapters.serving import adapter_setup  # noqa: PLC0415
    from release.registry.client import open_registry  # noqa: PLC0415
    from release.registry.store import STATE_DIR  # noqa: PLC0415
    from release.signing.keys import project_trust  # noqa: PLC0415

    ident = package.identity
    if ident.version == UNREGISTERED:
        raise InputError("--adapters serves a registered base (its adapters are found by its version)",
                         hint="relctl serve MODEL@production --adapters")
    return adapter_setup(open_registry(project_dir), ident.name, ident.version,
                         project_dir / STATE_DIR / "serve-cache", project_trust(project_dir),
                         lambda m: print(m, file=sys.stderr))


def _settings(config_path: Path) -> ServerSettings:
    return load_config(config_path).serving.server
