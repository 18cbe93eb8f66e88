"""What `relctl serve BASE --adapters` starts with, and the fetch every later load goes through.

Every adapter version the server loads, at start or at run time, is verified as serve verifies its base
(manifest digest recorded at release, signature against the trusted keys, the signature vouching for that
version) and must be bound by its signed manifest to the base this server runs (release/adapters/trust.py
check_bound): the registry's tags only find the candidates. A version is loaded only in a release state
its served name allows (trust.serving_refusal): a rejected version is never served.

Two sources: the registry (the production adapters of the served base version, found by their tags), or
package folders given as `MODEL[/VERSION]=DIR` (`--adapter-package`: what a KServe init container pulled
and verified, pinned by digest; the served set is then exactly those).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from release.adapters.trust import BaseIdentity, check_bound, production_adapters, serving_refusal
from release.core.errors import InputError
from release.core.model_name import check_model_name
from release.core.package import PackageManifest, verify_package
from release.registry import tags as T
from release.registry.refs import ADAPTER_PACKAGE, parse_version
from release.serving.adapters import Fetch, ServedAdapter, engine_name
from release.signing.keys import Trust
from release.signing.package import check_binding, verify_signature

if TYPE_CHECKING:  # the client loads MLflow: only a server of registered adapters opens it
    from release.registry import Registry

UNREGISTERED = "unregistered"
PACKAGE_OPTION = "--adapter-package"


@dataclass(frozen=True)
class AdapterSetup:
    """The adapters a server starts with, the fetch later loads go through, the base both are checked against."""

    served: list[ServedAdapter]
    fetch: Fetch
    base: BaseIdentity

    @property
    def folders(self) -> dict[str, Path]:
        return {a.engine_name: a.folder for a in self.served}


def registry_fetch(registry: Registry, base: BaseIdentity, cache: Path, trust: Trust,
                   warn: Callable[[str], None]) -> Fetch:
    """Loads from the registry: the version named (None: production), refused by release state before any
    download, verified, and checked to be bound to `base`. A version verified before (a switch back and
    forth) is not downloaded and signature-checked again while the registry still records the manifest digest
    the signature was checked against; its files are checked against that manifest again."""
    from release.registry import PRODUCTION  # noqa: PLC0415 - MLflow: loaded with the registry
    from release.registry.versions import fetch_package  # noqa: PLC0415 - signing and the package checks

    lock = threading.Lock()
    verified: dict[tuple[str, str], tuple[str, PackageManifest]] = {}

    def fetch(model: str, version: str | None, pinned: bool) -> tuple[str, PackageManifest]:
        with lock:  # one registry client, one download at a time
            mv = registry.version_for(model, PRODUCTION) if version is None else registry.get_version(model, version)
            if mv is None:
                raise InputError(f"{model} has no production version", hint="name a version")
            label = f"{model} v{mv.version}"
            if mv.tags.get(T.KIND) != "adapter":  # a tag may refuse fast (a whole model is never downloaded here)
                raise InputError(f"{label} is not an adapter", hint="load adapters released with relctl promote "
                                                                     "RUN --onto BASE@production")
            refusal = serving_refusal(registry, mv, pinned)
            if refusal:
                raise InputError(f"{label} is not served: {refusal}",
                                 hint=f"serve a released version of {model} (relctl history {model})")
            anchor, known = mv.tags.get(T.MANIFEST_SHA256, ""), verified.get((model, str(mv.version)))
            if known is not None and anchor and known[0] == anchor:
                package = verify_package(known[1].root, manifest_sha256=anchor)
            else:
                package = fetch_package(registry, model, str(mv.version), cache / model, mv, trust=trust, warn=warn)
                verified[(model, str(mv.version))] = (anchor, package)
            check_bound(package, label, base)
            return str(mv.version), package

    return fetch


def adapter_setup(registry: Registry, base: BaseIdentity, cache: Path, trust: Trust,
                  warn: Callable[[str], None]) -> AdapterSetup:
    """The production adapters of the registered base `base`, fetched into `cache` and checked."""
    assert base.version is not None
    fetch = registry_fetch(registry, base, cache, trust, warn)
    served = []
    for name, mv in production_adapters(registry, base.model, base.version).items():
        version, package = fetch(name, str(mv.version), False)
        served.append(ServedAdapter(name, version, engine_name(name, version), package.model_dir))
    return AdapterSetup(served, fetch, base)


def package_adapters(specs: Sequence[str], base: BaseIdentity, trust: Trust, warn: Callable[[str], None],
                     fetch: Fetch | None) -> AdapterSetup:
    """The adapters in package folders (`MODEL[/VERSION]=DIR` each), verified and checked against `base`.
    `fetch`: later loads (None: a base served from a folder has no registry, so none)."""
    served: list[ServedAdapter] = []
    for spec in specs:
        model, version, folder = parse_package_spec(spec)
        label = f"{model} v{version}" if version != UNREGISTERED else f"{model} ({folder})"
        manifest = verify_package(folder)
        verdict = verify_signature(folder, trust, label, folder=True, warn=warn)
        if version != UNREGISTERED:  # the signature must vouch for this very version, as a registry fetch's does
            check_binding(verdict, model, version, None, label)
        if manifest.model_name != model:
            raise InputError(f"{PACKAGE_OPTION} {spec}: the package is '{manifest.model_name}', not '{model}'",
                             hint="name the adapter's registered model before '='")
        check_bound(manifest, label, base)
        if any(a.model == model for a in served):
            raise InputError(f"{PACKAGE_OPTION}: {model} given twice", hint="one version per adapter")
        served.append(ServedAdapter(model, version, engine_name(model, version), manifest.model_dir))
    return AdapterSetup(served, fetch or _no_registry, base)


def parse_package_spec(spec: str) -> tuple[str, str, Path]:
    """(model, version or 'unregistered', folder) of `MODEL[/VERSION]=DIR`; InputError otherwise."""
    name, sep, folder = spec.partition("=")
    if not sep or not name or not folder:
        raise InputError(f"{PACKAGE_OPTION} {spec!r}: expected MODEL[/VERSION]=DIR",
                         hint=f"e.g. {PACKAGE_OPTION} tiny-llm-support/2=/mnt/models/adapters/tiny-llm-support")
    # MODEL/VERSION through the one parser of version spellings; a bare MODEL: an unregistered package
    model, version = parse_version(name, ADAPTER_PACKAGE) if "/" in name \
        else (check_model_name(name, PACKAGE_OPTION), UNREGISTERED)
    path = Path(folder)
    if not path.is_dir():
        raise InputError(f"{PACKAGE_OPTION} {spec}: {folder} is not a folder",
                         hint="point it at a package relctl pull wrote (or an adapter release built)")
    return model, version, path


def _no_registry(model: str, version: str | None, pinned: bool) -> tuple[str, PackageManifest]:
    raise InputError(f"{model}: this server serves a base from a package folder, so it loads no adapter from the "
                     "registry", hint="serve a registered base (relctl serve MODEL@production --adapters)")
