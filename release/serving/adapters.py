"""Adapters on a running base (`relctl serve BASE --adapters`): which are served, under which names, and the
switch an admin request, a rollback or a registry watcher makes while the base keeps serving (same process).

Clients name an adapter in the OpenAI `model` field by its registered model (`tiny-llm-support`); the engine
holds each loaded version under its own name (`tiny-llm-support-v2`). A version can also be served beside the
adapter's own name under its pinned name `MODEL:VERSION` (`tiny-llm-support:2`, as the base is `tiny-llm:1`):
the canary's candidate arm. Two served names of one version share one engine load.

No request fails because of a switch: a request takes a lease on the version its `model` named when it is
routed (`acquire`) and gives it back when its job has ended in the engine (streamed, cancelled, client gone,
failed, timed out alike). A switch loads the new version, points the name at it (new requests get it), and
the old version is unloaded only once no served name uses it and its last lease is given back; its unload
then runs on the table's own thread, never on a request's. A switch back to a version still draining takes
it back without loading it again. Every method is thread-safe (a registry watcher may switch from its own
thread); engine loads and unloads are serialized, lookups never wait for them.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from release.backends.base import AdapterRunner
from release.core.errors import InputError
from release.core.package import PackageManifest
from release.registry.refs import PINNED_NAME, parse_version

log = logging.getLogger("relctl.serve")

# (model, version or None for its production version, pinned) -> (version, its verified package): refusing a
# version not bound to this server's base or not servable by its release state (release/serving/adapter_setup.py)
Fetch = Callable[[str, str | None, bool], tuple[str, PackageManifest]]


@dataclass(frozen=True)
class ServedAdapter:
    model: str           # the registered model, what clients send as `model`
    version: str
    engine_name: str     # what the engine loaded it as
    folder: Path
    pinned: bool = False  # served as MODEL:VERSION beside MODEL (a canary's candidate), not as MODEL

    @property
    def served_name(self) -> str:
        """What clients send as `model` to reach this entry."""
        return pinned_name(self.model, self.version) if self.pinned else self.model


def engine_name(model: str, version: str) -> str:
    return f"{model}-v{version}"


def pinned_name(model: str, version: str) -> str:
    """The served name of one version of an adapter beside its production (`tiny-llm-support:2`)."""
    return f"{model}:{version}"


def split_pinned(name: str) -> tuple[str, str | None]:
    """(model, version) of a served name; version None for a plain adapter name. Registered model names never
    hold ':' (release/core/model_name.py), so the split is unambiguous; MODEL:VERSION is read by the one parser
    of version spellings (InputError for a version that is no version number)."""
    return parse_version(name, PINNED_NAME) if ":" in name else (name, None)


class AdapterLease:
    """One request's hold on the adapter version it was routed to; `release` is idempotent and thread-safe."""

    def __init__(self, table: AdapterTable, adapter: ServedAdapter) -> None:
        self.adapter = adapter
        self._table: AdapterTable | None = table
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            table, self._table = self._table, None
        if table is not None:
            table._give_back(self.adapter.engine_name)


class AdapterTable:
    """The adapters a server serves, the leases requests hold on them, and the engine loads behind both."""

    def __init__(self, runner: AdapterRunner, fetch: Fetch) -> None:
        self.runner = runner
        self.fetch = fetch
        self._served: dict[str, ServedAdapter] = {}
        self._loaded: set[str] = set()         # engine names the engine holds
        self._users: Counter[str] = Counter()  # engine name -> leases not given back
        self._lock = threading.Lock()          # the three above; held for microseconds
        self._engine_lock = threading.Lock()   # one engine load or unload at a time, with its decision
        self._unloader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relctl-adapter-unload")

    # -- requests ----------------------------------------------------------------------------------------
    def lookup(self, name: str) -> ServedAdapter | None:
        """The entry a `model` field names (an adapter's name or a pinned MODEL:VERSION), without a lease."""
        with self._lock:
            return self._served.get(name)

    def acquire(self, name: str) -> AdapterLease | None:
        """A lease on the version `name` is served at now: it stays loaded until the lease is released."""
        with self._lock:
            served = self._served.get(name)
            if served is None:
                return None
            self._users[served.engine_name] += 1
        return AdapterLease(self, served)

    def _give_back(self, engine: str) -> None:
        with self._lock:
            self._users[engine] -= 1
            if self._users[engine] > 0:
                return
            del self._users[engine]
            idle = engine in self._loaded and not self._serves(engine)
        if idle:  # the last request on a replaced version: unload it off the request's thread
            try:
                self._unloader.submit(self._unload_if_idle, engine)
            except RuntimeError:  # the server is shutting down (close): the engine goes with it
                log.debug("adapter %s: not unloaded, the server is stopping", engine)

    # -- what is served -----------------------------------------------------------------------------------
    def listing(self) -> list[ServedAdapter]:
        with self._lock:
            return sorted(self._served.values(), key=lambda a: a.served_name)

    def in_flight(self) -> dict[str, int]:
        """Engine name -> requests holding a lease on it (served versions and replaced ones alike)."""
        with self._lock:
            return {e: n for e, n in sorted(self._users.items()) if n}

    def draining(self) -> dict[str, int]:
        """Replaced versions the engine still holds for the requests using them: engine name -> requests."""
        with self._lock:
            return {e: self._users[e] for e in sorted(self._loaded) if not self._serves(e) and self._users[e]}

    def loaded(self) -> list[str]:
        """The engine names the engine holds (served, pinned or draining)."""
        with self._lock:
            return sorted(self._loaded)

    def adopt(self, served: ServedAdapter) -> None:
        """An adapter the engine loaded at start (Backend.open_adapter_runner)."""
        with self._lock:
            self._served[served.served_name] = served
            self._loaded.add(served.engine_name)

    def switch(self, model: str, version: str | None) -> tuple[ServedAdapter | None, ServedAdapter]:
        """Serve `model` at `version` (None: its production version): load it, point the name at it, unload
        what it replaced once no request uses it; (old, new)."""
        version, package = self.fetch(model, version, False)
        return self._put(ServedAdapter(model, version, engine_name(model, version), package.model_dir))

    def pin(self, model: str, version: str) -> tuple[ServedAdapter | None, ServedAdapter]:
        """Serve `model` v`version` under `MODEL:VERSION` beside `model` itself (which keeps its version)."""
        version, package = self.fetch(model, version, True)
        return self._put(ServedAdapter(model, version, engine_name(model, version), package.model_dir, pinned=True))

    def remove(self, name: str) -> ServedAdapter:
        """Stop serving `name` (an adapter's name or a pinned MODEL:VERSION); requests using it finish first."""
        with self._engine_lock:
            with self._lock:
                old = self._served.pop(name, None)
            if old is None:
                raise InputError(f"adapter {name} is not served here", hint="GET /admin/adapters lists them")
            self._settle(old.engine_name)
        return old

    def close(self) -> None:
        """Stop the unload thread (the server is shutting down; the engine goes with it)."""
        self._unloader.shutdown(wait=False, cancel_futures=True)

    # -- engine loads, one at a time ------------------------------------------------------------------------
    def _put(self, new: ServedAdapter) -> tuple[ServedAdapter | None, ServedAdapter]:
        with self._engine_lock:
            with self._lock:
                current = self._served.get(new.served_name)
                if current is not None and current.engine_name == new.engine_name:
                    return current, current
                held = new.engine_name in self._loaded  # served under another name, or still draining
            if not held:  # the slow part: requests keep being routed to the current version meanwhile
                self.runner.load_adapter(new.engine_name, new.folder)
            with self._lock:
                self._loaded.add(new.engine_name)
                old = self._served.get(new.served_name)
                self._served[new.served_name] = new
            if old is not None:
                self._settle(old.engine_name)
        return old, new

    def _unload_if_idle(self, engine: str) -> None:
        with self._engine_lock:
            self._settle(engine)

    def _settle(self, engine: str) -> None:
        """Unload `engine` if nothing uses it any more (the caller holds the engine lock, so no load or
        switch can take it back between the decision and the unload)."""
        with self._lock:
            if engine not in self._loaded or self._serves(engine) or self._users[engine] > 0:
                return
            self._loaded.discard(engine)
        try:
            self.runner.unload_adapter(engine)
        except Exception:  # the engine's own refusal: logged; the name is no longer served either way
            log.exception("adapter %s: unload failed", engine)

    def _serves(self, engine: str) -> bool:
        return any(a.engine_name == engine for a in self._served.values())
