"""Registered versions' packages: fetch one and verify its checksums before it is served or rolled back to."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow.artifacts

from release.errors import RegistryError
from release.registry import Registry
from release.stages.package import PackageManifest, verify_package

PACKAGE_URI_TAG = "relctl.package_uri"


def fetch_package(registry: Registry, name: str, version: str, dest: Path) -> PackageManifest:
    mv = registry.get_version(name, version)
    uri = mv.tags.get(PACKAGE_URI_TAG)
    if not uri:
        raise RegistryError(f"{name} v{version} has no {PACKAGE_URI_TAG} tag; it was not registered by relctl")
    target = dest / f"v{version}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=uri, dst_path=str(target), tracking_uri=registry.store.tracking_uri
    )
    return verify_package(Path(local))
