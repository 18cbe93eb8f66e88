"""The package format: what gets served, one folder with a checksummed manifest.

Layout of a package folder:
    model/               everything the package's backend loads (its `runtime_files` at least)
    source/              the training checkpoint's config.json / generation_config.json, for traceability
    relctl-package.json  manifest: sha256 of every other file, the backend that built it (id and version),
                         lineage, precision, serving config hash
    relctl-provenance.json, relctl-package.sig   added when a release signs the package (release/signing):
                         outside the manifest, which was written before them; the signature covers every
                         other file, the manifest and the provenance included
Checksums are verified before a package is served or rolled back to (`verify_package`); every other fact
about the model folder comes from the backend the manifest names (`release.backends.backend_of`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from release.core.errors import InputError
from release.core.hashing import sha256_file, sha256_json, sha256_tree
from release.core.jsonfile import expect, load_json


class Backend(Protocol):
    """What the package format needs of the backend that built a folder (release.backends.base.Backend has
    it): core stays below the backends, which it never imports."""

    @property
    def id(self) -> str: ...

    @property
    def runtime_files(self) -> tuple[str, ...]: ...

    def version(self) -> str: ...

    def runtime_config(self, model_dir: Path) -> dict[str, Any]: ...

MANIFEST = "relctl-package.json"
# Written by release/signing after the gates passed, so never listed in the manifest (the signature covers
# the manifest instead). Named here because verify_package must not take them for files added by hand.
SIGNATURE = "relctl-package.sig"
PROVENANCE = "relctl-provenance.json"
UNLISTED = frozenset({MANIFEST, SIGNATURE, PROVENANCE})
FORMAT = 2   # 2: the manifest names its backend; format 1 packages were all LEGACY_BACKEND's
SOURCE_FILES = ("config.json", "generation_config.json")
# Where a released package lives in its release run's artifacts (`runs:/<release run>/package`).
PACKAGE_ARTIFACT = "package"
LEGACY_BACKEND = "onnxruntime-genai"


@dataclass(frozen=True)
class PackageManifest:
    root: Path
    data: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def files(self) -> dict[str, str]:
        files: dict[str, str] = self.data["files"]
        return files

    @property
    def serving_config_hash(self) -> str:
        return str(self.data["serving_config_hash"])

    @property
    def model_name(self) -> str:
        return str(self.data.get("model_name", ""))

    @property
    def backend_id(self) -> str:
        entry = self.data.get("backend")
        return str(entry["id"]) if isinstance(entry, dict) and entry.get("id") else LEGACY_BACKEND

    @property
    def content_sha256(self) -> str:
        """Identity of what is served: the sha256 of every file but the manifest (the version's
        relctl.package_content_sha256, and what an adapter's manifest binds its base package by)."""
        return sha256_json(self.files)


def backend_entry(backend: Backend) -> dict[str, str]:
    """What a manifest records of the backend that built it."""
    return {"id": backend.id, "version": backend.version()}


def build_package(out_dir: Path, model_dir: Path, source_dir: Path, fields: dict[str, Any],
                  backend: Backend, link_model: bool = False) -> PackageManifest:
    """Copy the runtime model and source config into `out_dir` and write the manifest last.

    `fields` carries model_name, precision, lineage and serving (the serving config); the serving config
    hash covers it together with the backend's own runtime config (`Backend.runtime_config`).
    `backend`: the one that built `model_dir`. `link_model`: hard-link the model files where the file
    system allows (one copy on disk for a model relctl built itself; the manifest's digests still cover
    every byte, and the runner re-hashes a stage output before reusing it).
    """
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp / "model", copy_function=link_or_copy if link_model else shutil.copy2,
                    ignore=shutil.ignore_patterns(".relctl-output.json"))   # `relctl convert`'s marker of OUT
    (tmp / "source").mkdir()
    for name in SOURCE_FILES:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, tmp / "source" / name)
    missing_runtime(backend, tmp / "model", f"{out_dir.name}/model")
    runtime_cfg = backend.runtime_config(tmp / "model")
    data = {
        "format": FORMAT,
        **fields,
        "backend": backend_entry(backend),
        "serving_config_hash": sha256_json({"serving": fields.get("serving", {}), "runtime": runtime_cfg})[:16],
        "files": sha256_tree(tmp),
    }
    (tmp / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True))
    # The package appears whole or not at all.
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return PackageManifest(root=out_dir, data=data)


def link_or_copy(source: str, target: str) -> None:
    """A hard link to `source`, or a copy where one cannot be made (another file system)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def missing_runtime(backend: Backend, model_dir: Path, label: str) -> None:
    """InputError when `model_dir` lacks a file its backend cannot serve without."""
    for name in backend.runtime_files:
        if not (model_dir / name).is_file():
            raise InputError(f"{label}: {name} is missing (not a {backend.id} model folder)",
                             hint=f"build it with relctl convert --backend {backend.id} (or relctl promote)")


def load_manifest_data(path: Path) -> dict[str, Any]:
    """A manifest's JSON through the one loader, its shape checked: garbage or a wrong shape is bad input
    (exit 2) naming the file and the field, never a JSONDecodeError or TypeError from a reader."""
    label, hint = f"{path.parent.name}/{path.name}", "not a package relctl built; rebuild or re-download it"
    data = load_json(path, hint, label=label)
    if not isinstance(data, dict):
        raise InputError(f"{label}: not a JSON object", hint=hint)
    files = expect(data, "files", dict, label, hint)
    for rel, digest in files.items():
        parts = Path(rel).parts
        if rel.startswith("/") or ".." in parts or not isinstance(digest, str) or len(digest) != 64:
            raise InputError(f"{label}: files.{rel!r} is not a relative path with a sha256", hint=hint)
    for field in ("model_name", "serving_config_hash", "precision"):
        if field in data:
            expect(data, field, str, label, hint)
    if "backend" in data:
        expect(data, "backend.id", str, label, hint)
    return data


def read_manifest(root: Path) -> PackageManifest:
    """The manifest of a package its caller has already verified (no checksums: they were checked)."""
    path = root / MANIFEST
    if not path.is_file():
        raise InputError(f"{root}: not a relctl package ({MANIFEST} missing)", hint="build it with relctl promote")
    return PackageManifest(root=root, data=load_manifest_data(path))


def verify_package(root: Path, manifest_sha256: str | None = None) -> PackageManifest:
    """Read the manifest and check every file's sha256; raise InputError on any difference.

    `manifest_sha256` is the digest the registry recorded when the version was released: a manifest
    rewritten to match changed files no longer matches it, so the check is anchored outside the package.
    """
    path = root / MANIFEST
    if not path.is_file():
        raise InputError(f"{root}: not a relctl package ({MANIFEST} missing)", hint="build it with relctl promote")
    if manifest_sha256 is not None and sha256_file(path) != manifest_sha256:
        raise InputError(
            f"{root.name}: {MANIFEST} differs from the manifest recorded in the registry when it was released",
            hint="the package was rewritten after release; restore it from the release run or re-promote",
        )
    data = load_manifest_data(path)
    actual = sha256_tree(root, exclude=UNLISTED)
    expected: dict[str, str] = data["files"]
    for rel, digest in expected.items():
        if rel not in actual:
            raise InputError(f"{root.name}: {rel} is missing from the package", hint="re-download or rebuild it")
        if actual[rel] != digest:
            raise InputError(
                f"{root.name}: {rel} does not match its sha256 in {MANIFEST}",
                hint="the package was modified after it was built; rebuild it or restore the original",
            )
    extra = sorted(set(actual) - set(expected))
    if extra:
        raise InputError(f"{root.name}: {extra[0]} is not listed in {MANIFEST}", hint="remove files added by hand")
    return PackageManifest(root=root, data=data)
