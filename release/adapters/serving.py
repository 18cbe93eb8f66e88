"""Adapters on a running base (`relctl serve BASE --adapters`): which are served, under which names, and
the switch an admin request or a rollback makes while the base keeps serving (same process, no restart).

Clients name an adapter in the OpenAI `model` field by its registered model (`tiny-llm-support`); the engine
holds each loaded version under its own name (`tiny-llm-support-v2`), so a switch loads the new version
first, points the name at it, then unloads the old one: no request sees a missing adapter.

A version can also be served beside the adapter's own name under its pinned name `MODEL:VERSION`
(`tiny-llm-support:2`, as the base is `tiny-llm:1`): the canary's candidate arm. Two served names of one
version share its engine name; the engine unloads it only when no served name uses it any more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from release.backends.base import AdapterRunner
from release.core.errors import InputError
from release.core.package import PackageManifest
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.signing.keys import Trust

KIND = "adapter"


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
    hold ':' (release/core/model_name.py), so the split is unambiguous."""
    model, sep, version = name.rpartition(":")
    return (model, version) if sep else (name, None)


def production_adapters(registry: Registry, base_model: str, base_version: str) -> dict[str, VersionRecord]:
    """The production version of every adapter built for `base_model` v`base_version` (by its tags): one
    search for the models with such a version, then the production alias of those alone (not of every model)."""
    found: dict[str, VersionRecord] = {}
    built_for = {T.KIND: KIND, T.BASE_MODEL: base_model, T.BASE_VERSION: base_version}
    for name in registry.models_tagged(built_for):
        mv = registry.version_for(name, PRODUCTION)
        if mv is not None and mv.tags.get(T.KIND) == KIND and mv.tags.get(T.BASE_MODEL) == base_model \
                and mv.tags.get(T.BASE_VERSION) == base_version:
            found[name] = mv
    return found


def check_adapter_for(mv: VersionRecord, base_model: str, base_version: str, base_sha256: str | None) -> None:
    """InputError unless `mv` is an adapter built and validated for this base version (same digest)."""
    label = f"{mv.name} v{mv.version}"
    if mv.tags.get(T.KIND) != KIND:
        raise InputError(f"{label} is not an adapter", hint="load adapters released with relctl promote --onto")
    built = (mv.tags.get(T.BASE_MODEL), mv.tags.get(T.BASE_VERSION))
    if built != (base_model, base_version) or (base_sha256 and mv.tags.get(T.BASE_SHA256) != base_sha256):
        raise InputError(f"{label} was built for {built[0]} v{built[1]} ({mv.tags.get(T.BASE_SHA256)}); this "
                         f"server runs {base_model} v{base_version} ({base_sha256})",
                         hint="release the adapter onto this base: relctl promote RUN --onto BASE@production")


class AdapterTable:
    """The adapters a server serves, switched under a lock; the engine's load/unload outside it."""

    def __init__(self, runner: AdapterRunner, fetch: Callable[[str, str | None], tuple[str, PackageManifest]]
                 ) -> None:
        self.runner = runner
        # (model, version or None for its production version) -> (version, its verified package), refusing
        # an adapter that was not built for this server's base version
        self.fetch = fetch
        self._served: dict[str, ServedAdapter] = {}
        self._lock = threading.Lock()
        # One switch at a time (an admin request and the server following the registry may ask at once): two
        # would both load the same version before either points a name at it.
        self._switching = threading.Lock()

    def lookup(self, name: str) -> ServedAdapter | None:
        """The entry a request's `model` field names (an adapter's name or a pinned MODEL:VERSION)."""
        with self._lock:
            return self._served.get(name)

    def listing(self) -> list[ServedAdapter]:
        with self._lock:
            return sorted(self._served.values(), key=lambda a: a.served_name)

    def adopt(self, served: ServedAdapter) -> None:
        """An adapter the engine loaded at start (open_adapter_runner)."""
        with self._lock:
            self._served[served.served_name] = served

    def switch(self, model: str, version: str | None) -> tuple[ServedAdapter | None, ServedAdapter]:
        """Serve `model` at `version` (None: its production version): load it, point the name at it, unload
        what it replaced; (old, new)."""
        with self._switching:
            version, package = self.fetch(model, version)
            current = self.lookup(model)
            if current is not None and current.version == version:
                return current, current
            new = ServedAdapter(model, version, engine_name(model, version), package.model_dir)
            return self._put(new)

    def pin(self, model: str, version: str) -> tuple[ServedAdapter | None, ServedAdapter]:
        """Serve `model` v`version` under `MODEL:VERSION` beside `model` itself (which keeps its version)."""
        with self._switching:
            version, package = self.fetch(model, version)
            current = self.lookup(pinned_name(model, version))
            if current is not None:
                return current, current
            return self._put(ServedAdapter(model, version, engine_name(model, version), package.model_dir,
                                           pinned=True))

    def _put(self, new: ServedAdapter) -> tuple[ServedAdapter | None, ServedAdapter]:
        # The engine loads a version once: a pinned name and the adapter's own name may share it.
        if not self._engine_uses(new.engine_name):
            self.runner.load_adapter(new.engine_name, new.folder)
        with self._lock:
            old = self._served.get(new.served_name)
            self._served[new.served_name] = new
        self._release(old)
        return old, new

    def remove(self, name: str) -> ServedAdapter:
        """Stop serving `name` (an adapter's name or a pinned MODEL:VERSION)."""
        with self._lock:
            old = self._served.pop(name, None)
        if old is None:
            raise InputError(f"adapter {name} is not served here", hint="GET /admin/adapters lists them")
        self._release(old)
        return old

    def _engine_uses(self, engine: str) -> bool:
        with self._lock:
            return any(a.engine_name == engine for a in self._served.values())

    def _release(self, old: ServedAdapter | None) -> None:
        """Unload `old`'s engine name unless another served name still uses it."""
        if old is not None and not self._engine_uses(old.engine_name):
            self.runner.unload_adapter(old.engine_name)


@dataclass(frozen=True)
class AdapterSetup:
    """What `relctl serve BASE --adapters` starts with: the production adapters of this base version."""

    served: list[ServedAdapter]
    fetch: Callable[[str, str | None], tuple[str, PackageManifest]]

    @property
    def folders(self) -> dict[str, Path]:
        return {a.engine_name: a.folder for a in self.served}


def adapter_setup(registry: Registry, base_model: str, base_version: str, cache: Path, trust: Trust,
                  warn: Callable[[str], None]) -> AdapterSetup:
    """The production adapters built for `base_model` v`base_version`, fetched and verified into `cache`, and
    the fetcher later loads go through (the same checks)."""
    from release.registry.versions import fetch_package  # noqa: PLC0415 - signing and the package checks

    base = registry.get_version(base_model, base_version)
    if base.tags.get(T.KIND) == KIND:
        raise InputError(f"{base_model} v{base_version} is an adapter; serve its base with --adapters",
                         hint=f"relctl serve {base.tags.get(T.BASE_MODEL)}@production --adapters")
    digest = base.tags.get(T.BASE_SHA256)
    lock = threading.Lock()

    def fetch(model: str, version: str | None) -> tuple[str, PackageManifest]:
        with lock:  # one registry client, one download at a time
            mv = registry.version_for(model, PRODUCTION) if version is None else registry.get_version(model, version)
            if mv is None:
                raise InputError(f"{model} has no production version", hint="name a version")
            check_adapter_for(mv, base_model, base_version, digest)
            package = fetch_package(registry, model, str(mv.version), cache / model, mv, trust=trust, warn=warn)
            return str(mv.version), package

    served = []
    for name, mv in production_adapters(registry, base_model, base_version).items():
        version, package = fetch(name, str(mv.version))
        served.append(ServedAdapter(name, version, engine_name(name, version), package.model_dir))
    return AdapterSetup(served, fetch)
