"""What `relctl serve` serves: a package folder, or `<model>@<alias>` resolved through the MLflow registry.

Either way the package's checksums are verified before anything is loaded.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from release.errors import InputError, RegistryError
from release.serving.metrics import Identity
from release.stages.package import PackageManifest, verify_package
from release.store import STATE_DIR, resolve_store

PACKAGE_URI_TAG = "relctl.package_uri"
UNREGISTERED = "unregistered"


@dataclass(frozen=True)
class ServedPackage:
    manifest: PackageManifest
    identity: Identity


def resolve_package(spec: str, project_dir: Path, environ: dict[str, str] | None = None) -> ServedPackage:
    """A verified package for `spec`: an existing folder, or `name@alias` from the registry."""
    path = Path(spec)
    if path.is_dir():
        manifest = verify_package(path)
        name = manifest.model_name or path.name
        return ServedPackage(manifest, Identity(name, UNREGISTERED, manifest.serving_config_hash))
    if "@" not in spec:
        raise InputError(f"{spec}: no such package folder", hint="pass a package folder or <model>@<alias>")
    name, _, alias = spec.partition("@")
    if not name or not alias:
        raise InputError(f"{spec}: expected <model>@<alias>", hint="e.g. relctl serve my-model@production")
    return _from_registry(name, alias, project_dir, environ)


def _from_registry(name: str, alias: str, project_dir: Path, environ: dict[str, str] | None) -> ServedPackage:
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    store = resolve_store(project_dir, environ)
    client = MlflowClient(tracking_uri=store.tracking_uri, registry_uri=store.tracking_uri)
    try:
        version = client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
            raise InputError(f"{name}@{alias}: no such model or alias in the registry",
                             hint=f"list versions with `relctl history {name}`") from exc
        raise RegistryError(f"{name}@{alias}: registry lookup failed: {exc}") from exc
    uri = version.tags.get(PACKAGE_URI_TAG)
    if not uri:
        raise InputError(f"{name} version {version.version}: tag {PACKAGE_URI_TAG} is missing",
                         hint="the version was not registered by relctl promote; re-register it")
    cache = project_dir / STATE_DIR / "serve-cache" / name / str(version.version)
    if not _verified(cache):
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            local = Path(download_artifacts(artifact_uri=uri, dst_path=str(partial), tracking_uri=store.tracking_uri))
        except MlflowException as exc:
            raise RegistryError(f"{name} version {version.version}: cannot download {uri}: {exc}") from exc
        shutil.rmtree(cache, ignore_errors=True)
        local.rename(cache)
        shutil.rmtree(partial, ignore_errors=True)
    manifest = verify_package(cache)
    return ServedPackage(manifest, Identity(name, str(version.version), manifest.serving_config_hash))


def _verified(path: Path) -> bool:
    if not path.is_dir():
        return False
    try:
        verify_package(path)
    except InputError:
        return False
    return True
