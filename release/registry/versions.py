"""Registered versions' packages: fetch one and verify it against the registry before it is served or rolled back to.

The checksum that counts is the one recorded on the version when it was released
(`relctl.package_manifest_sha256`): the manifest must still have that digest, and every file must still
match the manifest. A package whose files and manifest were rewritten together is refused. Someone who can write the
registry's tags too is stopped by the signature (release/signing): with trusted keys configured, every
fetched version must be signed by one of them, the files checked against the signed statement.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from release.core.errors import InputError, RegistryError
from release.core.package import PACKAGE_ARTIFACT, PackageManifest, verify_package
from release.registry import package_links
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.signing.keys import Trust
from release.signing.package import Verdict, check_binding, verify_signature

if TYPE_CHECKING:  # the client loads mlflow: a caller hands its Registry in; importing this module stays light
    from release.registry.client import Registry


def package_uri(tags: dict[str, str]) -> str | None:
    """Where a version's package lives: `package/` of the release run that registered it, the first of its
    release runs (a re-gate records its evidence in a later run, never a package; older versions name it in
    a tag)."""
    if tags.get(T.PACKAGE_URI):
        return tags[T.PACKAGE_URI]
    runs = T.release_runs(tags)
    return f"runs:/{runs[0]}/{PACKAGE_ARTIFACT}" if runs else None


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def fetch_package(registry: Registry, name: str, version: str, dest: Path, mv: VersionRecord | None = None, *,
                  trust: Trust, warn: Callable[[str], None] = _stderr) -> PackageManifest:
    """Download version `version` of `name` under `dest` and verify it (fetch_verified); the manifest."""
    return fetch_verified(registry, name, version, dest, mv, trust=trust, warn=warn)[0]


def fetch_verified(registry: Registry, name: str, version: str, dest: Path, mv: VersionRecord | None = None, *,
                   trust: Trust, warn: Callable[[str], None] = _stderr) -> tuple[PackageManifest, Verdict]:
    """Download version `version` of `name` under `dest` and verify it: against the manifest digest the
    registry recorded, then its signature against `trust` (every caller names the trust: none forgets it),
    then that the signature vouches for this version. `mv`: the version when the caller has read it already."""
    mv = mv or registry.get_version(name, version)
    uri = package_uri(dict(mv.tags))
    if not uri:
        raise RegistryError(f"{name} v{version} has no {T.RELEASE_RUN} tag; it was not registered by relctl")
    anchor = mv.tags.get(T.MANIFEST_SHA256)
    if not anchor:
        raise InputError(f"{name} v{version} has no {T.MANIFEST_SHA256} tag, so its package cannot be verified",
                         hint="re-register it with relctl register, which records the digest")
    target = dest / f"v{version}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    local = registry.download_uri(uri, target)
    fill_linked(registry, uri, local, target)
    return verify_version(registry, local, mv, trust, warn)


def fill_linked(registry: Registry, uri: str, local: Path, scratch: Path) -> None:
    """Put the files the package leaves to its MLflow model (release/registry/package_links.py) into the
    downloaded `local`; the manifest check that follows covers them. Nothing for older versions."""
    try:
        note = registry.download_uri(package_links.links_uri(uri), scratch / ".links")
    except RegistryError:
        return  # no links file: the release run's package/ holds every file
    model_id, files = package_links.read_links(note)
    location = registry.client.get_logged_model(model_id).artifact_location.rstrip("/")
    for relative, name in files.items():
        into = local / relative
        into.parent.mkdir(parents=True, exist_ok=True)
        fetched = registry.download_uri(f"{location}/{name}", scratch / ".linked")
        fetched.replace(into)
    shutil.rmtree(scratch / ".links", ignore_errors=True)
    shutil.rmtree(scratch / ".linked", ignore_errors=True)


def verify_version(registry: Registry, local: Path, mv: VersionRecord, trust: Trust,
                   warn: Callable[[str], None] = _stderr) -> tuple[PackageManifest, Verdict]:
    """The one check every reader of a registered version goes through (serve, rollback, canary, gates,
    approve, trace, verify, publish, pull): the files against the manifest digest recorded at release, the
    signature against the trusted keys, and the signed provenance against this version (its model and the
    release run that created it: MLflow's version source run, which no tag rewrite changes)."""
    name, version = mv.name, str(mv.version)
    label = f"{name} v{version}"
    try:
        manifest = verify_package(local, manifest_sha256=mv.tags.get(T.MANIFEST_SHA256, ""))
    except InputError as exc:
        raise InputError(f"{label}: {exc.message}", hint=exc.hint) from exc
    verdict = verify_signature(local, trust, label, warn=warn)

    def describe(run_id: str) -> str | None:
        found = registry.find_versions(name, T.RELEASE_RUN, run_id) if registry.model_exists(name) else []
        return f"{name} v{found[0].version}" if found else None

    check_binding(verdict, name, version, mv.run_id or mv.tags.get(T.RELEASE_RUN), label, describe)
    return manifest, verdict
