"""What `relctl serve` serves: a package folder, or a registered version from the MLflow registry, named
`MODEL@ALIAS`, `MODEL/VERSION`, `models:/MODEL@ALIAS` or `models:/MODEL/VERSION`.

A registered version is fetched through release.registry.versions.fetch_package, which verifies it against the
manifest digest recorded on the version when it was released, and kept in a cache under the project's
state folder (re-verified against that digest and its signature before each use). A local folder is
verified against its own manifest and, when it carries one, its signature (an unsigned folder is served
with a warning); it is served as version `unregistered`. Trusted keys: the project's release.yaml
`signing.trusted_keys` and RELCTL_TRUSTED_KEYS (release/signing/keys.py).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from release.core.errors import InputError
from release.core.package import PackageManifest, verify_package
from release.registry.refs import ModelRef, serve_ref
from release.registry.store import STATE_DIR, resolve_store
from release.registry.versions import fetch_package, verify_version
from release.serving.metrics import Identity
from release.signing.keys import Trust, project_trust
from release.signing.package import verify_signature

UNREGISTERED = "unregistered"
VersionRef = ModelRef  # a registered version, by alias or by number (release/registry/refs.py)


@dataclass(frozen=True)
class ServedPackage:
    manifest: PackageManifest
    identity: Identity


def parse_spec(spec: str) -> VersionRef:
    """The registry reference in `spec` (not a folder); InputError naming the accepted forms otherwise."""
    return serve_ref(spec)


def resolve_package(spec: str, project_dir: Path, environ: dict[str, str] | None = None,
                    cached_only: bool = False) -> ServedPackage:
    """A verified package for `spec` (see the module docstring for the forms it takes). `cached_only`: a
    registered version is served from the cache or not at all: files put there by a ModelCar or an init
    container that no longer match the registry's digest are refused naming the file (InputError),
    instead of being replaced by a download that would hide the change."""
    path = Path(spec)
    trust = project_trust(project_dir, environ)
    if not spec.startswith("models:/") and path.is_dir():
        manifest = verify_package(path)
        verify_signature(path, trust, path.name, folder=True, warn=_stderr)
        name = manifest.model_name or path.name
        return ServedPackage(manifest, Identity(name, UNREGISTERED, manifest.serving_config_hash))
    return _from_registry(parse_spec(spec), project_dir, environ, trust, cached_only)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _from_registry(ref: VersionRef, project_dir: Path, environ: dict[str, str] | None,
                   trust: Trust, cached_only: bool = False) -> ServedPackage:
    # mlflow loads only when serving from the registry, not for a package folder
    from release.registry import Registry  # noqa: PLC0415
    from release.registry import tags as T  # noqa: PLC0415

    registry = Registry(resolve_store(project_dir, environ))
    if ref.alias is not None:
        found = registry.version_for(ref.model, ref.alias)
        if found is None:
            raise InputError(f"{ref.model}@{ref.alias}: no such model or alias in the registry",
                             hint=f"list its aliases with `relctl status {ref.model}`")
        version = str(found.version)
    else:
        assert ref.version is not None
        version = ref.version
    mv = registry.get_version(ref.model, version)
    anchor = mv.tags.get(T.MANIFEST_SHA256)
    cache = project_dir / STATE_DIR / "serve-cache" / ref.model / version
    if cached_only:
        if not cache.is_dir():
            raise InputError(f"{ref.model}/{version}: not in the serve cache ({cache})",
                             hint="the ModelCar or init container puts it there; without --cached-only serve "
                                  "downloads it from the registry")
        if anchor is None:
            raise InputError(f"{ref.model}/{version}: the registry records no manifest digest for this version",
                             hint="serve a version relctl released (promote or register)")
        verify_package(cache, manifest_sha256=anchor)  # names the changed file
    manifest = _cached(cache, anchor)
    if manifest is not None:  # the cache matched the registry's digest; its signature is checked all the same
        verify_version(registry, cache, mv, trust, warn=_stderr)
    else:
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        # verified against the registry's digest and the trusted keys
        fetched = fetch_package(registry, ref.model, version, partial, mv, trust=trust, warn=_stderr)
        shutil.rmtree(cache, ignore_errors=True)
        fetched.root.rename(cache)
        shutil.rmtree(partial, ignore_errors=True)
        manifest = PackageManifest(cache, fetched.data)
    return ServedPackage(manifest, Identity(ref.model, version, manifest.serving_config_hash))


def _cached(path: Path, anchor: str | None) -> PackageManifest | None:
    """The cached package when it still matches the registry's digest (never trusted on its own)."""
    if anchor is None or not path.is_dir():
        return None
    try:
        return verify_package(path, manifest_sha256=anchor)
    except InputError:
        return None
