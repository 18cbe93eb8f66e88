"""The library entry point behind `relctl serve` (the CLI only parses and calls it)."""

from __future__ import annotations

import hmac
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.config import config_path as project_config_path
from release.config import load_config
from release.core.errors import InputError
from release.core.server_settings import ServerSettings
from release.serving.follow import DEFAULT_INTERVAL_S, Follower, Table
from release.serving.server import bind_listener, load_state, package_settings, run_server
from release.serving.source import UNREGISTERED, ServedPackage, resolve_package

if TYPE_CHECKING:
    from release.serving.adapter_setup import AdapterSetup


def serve(spec: str, *, host: str = "127.0.0.1", port: int = 8000, project_dir: Path,
          config_path: Path | None = None, ready_file: Path | None = None,
          on_ready: Callable[[dict[str, Any]], None] | None = None, api_key: str | None = None,
          served_model_name: str | None = None, cached_only: bool = False, adapters: bool = False,
          admin_key: str | None = None, adapter_packages: Sequence[str] = (),
          follow_interval: float = DEFAULT_INTERVAL_S) -> None:
    """Verify and load `spec` and serve it until SIGINT/SIGTERM. `spec`: a package folder, MODEL@ALIAS,
    MODEL/VERSION, models:/MODEL@ALIAS or models:/MODEL/VERSION (release.serving.source).

    Settings: `serving.server` of `config_path` (release.yaml) when given, else the package's own.
    `api_key`: required as `Authorization: Bearer <key>` on every path but /health and /admin/*.
    `admin_key`: the one key /admin/* accepts (none: the admin paths are refused); never a completions key.
    `served_model_name`: the model id clients see and send (default `<model>:<version>`; the X-Relctl-*
    headers always name the registered version). `cached_only`: a registered version only from the serve
    cache (see release.serving.source.resolve_package). `on_ready` receives {url, pid, model, serving_config,
    load_time_s}. `adapters`: serve the base's production LoRA adapters beside it (the `model` field names
    one) and let /admin/adapters load and unload them at run time (docs/adapters.md). `adapter_packages`:
    `MODEL[/VERSION]=DIR` package folders served instead of the registry's production adapters (a pod's
    pinned adapters, pulled and verified by its init containers). A server of the registry's adapters follows
    their production aliases, reading the registry every `follow_interval` seconds (0: it only records
    itself), and records itself in the registry (release/serving/follow.py); one of package folders serves
    exactly those.
    """
    for option, key in (("--api-key", api_key), ("--admin-key", admin_key)):
        if key is not None and not key.strip():
            raise InputError(f"{option}: empty", hint=f"pass a non-empty key, or leave {option} and its variable unset")
    if admin_key is not None and api_key is not None and hmac.compare_digest(admin_key, api_key):
        raise InputError("--admin-key equals --api-key: every completion client could switch adapters",
                         hint="give the admin its own key (RELCTL_ADMIN_KEY), held by whoever releases adapters")
    listener = bind_listener(host, port)   # the port first: a busy one is refused before the slow load
    try:
        _serve_on(listener, spec, host, port, project_dir, config_path, ready_file, on_ready, api_key,
                  served_model_name, cached_only, adapters, admin_key, adapter_packages, follow_interval)
    finally:
        listener.close()


def _serve_on(listener: socket.socket, spec: str, host: str, port: int, project_dir: Path, config_path: Path | None,
              ready_file: Path | None, on_ready: Callable[[dict[str, Any]], None] | None, api_key: str | None,
              served_model_name: str | None, cached_only: bool, adapters: bool, admin_key: str | None,
              adapter_packages: Sequence[str], follow_interval: float) -> None:
    package = resolve_package(spec, project_dir, cached_only=cached_only)
    refuse_adapter_package(spec, package)
    given = _project_file(project_dir, config_path)
    settings = _settings(given) if given is not None else package_settings(package)
    follower = None
    if adapters or adapter_packages:
        from release.serving.adapters import AdapterTable  # noqa: PLC0415 - only a server of adapters

        setup = base_adapters(package, project_dir, adapter_packages)
        state = load_state(package, settings, project_dir, setup.folders)
        table = AdapterTable(state.engine.runner, setup.fetch)  # type: ignore[arg-type]
        for served in setup.served:
            table.adopt(served)
        state.adapters, state.adapter_base = table, setup.base.to_dict()
        if not adapter_packages:  # the registry's adapters (a registered base): follow their production
            ident = package.identity
            follower = registry_follower(project_dir, table, ident.name, ident.version, follow_interval)
    else:
        state = load_state(package, settings, project_dir)
    state.api_key, state.admin_key = api_key, admin_key
    state.served_name = served_model_name or ""

    def ready(info: dict[str, Any]) -> None:
        if follower is not None:  # listening: its URL is known, so it records itself and starts to follow
            follower.start(info["url"], socket.gethostname(), int(info["pid"]))
        if on_ready is not None:
            on_ready(info)

    try:
        run_server(state, host, port, ready_file=ready_file, on_ready=ready, sock=listener)
    finally:
        if follower is not None:
            follower.stop()


def registry_follower(project_dir: Path, table: Table, base_model: str, base_version: str,
                      interval_s: float) -> Follower:
    """The watch on the adapters' production aliases, on its own registry client (its own thread)."""
    from release.registry.client import open_registry  # noqa: PLC0415 - only a server of adapters

    return Follower(open_registry(project_dir), table, base_model, base_version, interval_s)


def refuse_adapter_package(spec: str, package: ServedPackage) -> None:
    """An adapter's package is not a model: InputError naming its base and the command that serves it."""
    from release.adapters.trust import KIND  # noqa: PLC0415 - as base_adapters

    if package.manifest.data.get("kind") != KIND:
        return
    base = package.manifest.data.get("base")
    name = base.get("model") if isinstance(base, dict) and isinstance(base.get("model"), str) else "BASE"
    raise InputError(f"{spec} is a LoRA adapter ({package.identity.model_id}), not a whole model: it serves beside "
                     f"its base {name}", hint=f"relctl serve {name}@production --adapters")


def base_adapters(package: ServedPackage, project_dir: Path, adapter_packages: Sequence[str] = ()) -> AdapterSetup:
    """The adapters a server of `package` starts with: `adapter_packages` (folders) when given, else the
    production adapters of the registered base; each checked against the base `package` is."""
    from release.adapters.trust import BaseIdentity  # noqa: PLC0415
    from release.registry.store import STATE_DIR  # noqa: PLC0415
    from release.serving.adapter_setup import adapter_setup, package_adapters, registry_fetch  # noqa: PLC0415
    from release.signing.keys import project_trust  # noqa: PLC0415

    ident = package.identity
    registered = ident.version != UNREGISTERED
    base = BaseIdentity.of_package(package.manifest, ident.name, ident.version if registered else None)
    trust = project_trust(project_dir)
    cache = project_dir / STATE_DIR / "serve-cache"
    if adapter_packages:
        fetch = registry_fetch(_registry(project_dir), base, cache, trust, _stderr) if registered else None
        return package_adapters(adapter_packages, base, trust, _stderr, fetch)
    if not registered:
        raise InputError("--adapters serves a registered base (its adapters are found by its version)",
                         hint="relctl serve MODEL@production --adapters, or name the adapters: --adapter-package "
                              "MODEL=DIR")
    return adapter_setup(_registry(project_dir), base, cache, trust, _stderr)


def _registry(project_dir: Path) -> Any:
    from release.registry.client import open_registry  # noqa: PLC0415

    return open_registry(project_dir)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _settings(config_path: Path) -> ServerSettings:
    return load_config(config_path).serving.server


def _project_file(project_dir: Path, given: Path | None) -> Path | None:
    """--config FILE against the project folder, as every project command reads -c (release/config.py)."""
    return None if given is None else project_config_path(project_dir, given)
