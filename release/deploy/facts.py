"""What a manifest needs to know about a registered version, read from the registry before anything is written.

`relctl render kserve MODEL/VERSION` sizes, schedules and starts the deployment from the version itself: its
backend, which decides from the package's small config files (its `deploy_files`) the device it was built
and validated for, the image, args and environment, and from its memory plan the memory per replica; and,
once published, its OCI digest. The package's own files are read without downloading the package: the
manifest (relctl-package.json), checked against the digest the registry recorded at release, and the files
the backend names, each checked against its sha256 there. A version that does not exist, or whose manifest
does not match, is refused (exit 2) before a line of the manifest is written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.backends import get_backend
from release.backends.base import Deployment
from release.core.errors import InputError
from release.core.hashing import sha256_file
from release.core.jsonfile import load_json
from release.core.package import LEGACY_BACKEND, MANIFEST, load_manifest_data
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.registry.versions import package_uri

TEMPLATE = "kserve-inferenceservice.yaml"


@dataclass(frozen=True)
class VersionFacts:
    """One registered version as a deployment sees it: its backend, the small files and memory figures that
    backend decides a deployment from (`Backend.deployment`), and its OCI digest once published. `files` is
    None when only MODEL/VERSION is known: nothing is refused then, and the memory must be given."""

    model: str
    version: str
    backend: str = LEGACY_BACKEND
    files: dict[str, dict[str, Any]] | None = None
    memory: dict[str, float] = field(default_factory=dict)   # the release's memory.* figures, unprefixed
    oci_uri: str | None = None                 # oci://HOST/REPO@sha256:..., set by `relctl publish`

    def deployment(self, device: str | None = None) -> Deployment:
        """How the version runs on `device` (None: the device it was validated on), as its backend decides."""
        if self.files is None:
            per_replica = self.memory.get("per_replica_bytes")
            return Deployment(validated_device="unknown", template=TEMPLATE,
                              memory_bytes=int(per_replica) if per_replica else None)
        return get_backend(self.backend).deployment(self.files, self.memory, device)


def read_version_facts(registry: Registry, model: str, version: str) -> VersionFacts:
    """The facts of `model` v`version`; InputError (exit 2) when it does not exist, its backend is not installed
    here, or its manifest does not match."""
    mv = registry.get_version(model, version)   # InputError "not found" for a version that does not exist
    metrics, _ = registry.recorded_numbers(mv)
    memory = {key.removeprefix(T.MEMORY_PREFIX): float(value) for key, value in metrics.items()
              if key.startswith(T.MEMORY_PREFIX)}
    backend = mv.tags.get(T.BACKEND) or LEGACY_BACKEND
    files = package_files(registry, mv, get_backend(backend).deploy_files)
    return VersionFacts(model, version, backend, files, memory, mv.tags.get(T.OCI_DIGEST) or None)


def version_manifest(registry: Registry, mv: VersionRecord) -> dict[str, Any]:
    """The version's package manifest alone (what its package says it is), checked against the digest the
    registry recorded at release."""
    with tempfile.TemporaryDirectory(prefix="relctl-render-") as tmp:
        return _manifest(registry, mv, Path(tmp))[1]


def package_files(registry: Registry, mv: VersionRecord, wanted: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The package's small config files, verified: the manifest against the registry's digest, each file
    against the manifest. Only these are downloaded, never the weights."""
    label = f"{mv.name} v{mv.version}"
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="relctl-render-") as tmp:
        uri, data = _manifest(registry, mv, Path(tmp))
        listed: dict[str, str] = data["files"]
        for rel in wanted:
            if rel not in listed:
                continue
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            local = registry.download_uri(f"{uri}/{rel}", (Path(tmp) / rel).parent)
            if sha256_file(local) != listed[rel]:
                raise InputError(f"{label}: {rel} does not match its sha256 in {MANIFEST}",
                                 hint=f"relctl verify {mv.name}/{mv.version} names what changed")
            out[rel] = load_json(local, "rebuild the package", label=f"{label}: {rel}")
    return out


def _manifest(registry: Registry, mv: VersionRecord, tmp: Path) -> tuple[str, dict[str, Any]]:
    """(the package's URI, its manifest's data), the manifest downloaded into `tmp` and checked."""
    label = f"{mv.name} v{mv.version}"
    uri = package_uri(dict(mv.tags))
    anchor = mv.tags.get(T.MANIFEST_SHA256)
    if not uri or not anchor:
        raise InputError(f"{label} was not released by relctl (no {T.RELEASE_RUN} or {T.MANIFEST_SHA256} tag)",
                         hint="render a version that relctl promote or relctl register recorded")
    (tmp / "manifest").mkdir()
    manifest_path = registry.download_uri(f"{uri}/{MANIFEST}", tmp / "manifest")
    if sha256_file(manifest_path) != anchor:
        raise InputError(f"{label}: {MANIFEST} differs from the manifest recorded in the registry at release",
                         hint=f"relctl verify {mv.name}/{mv.version} names what changed")
    return uri, load_manifest_data(manifest_path)
