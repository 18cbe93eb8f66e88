"""One stored copy of a package's weights in the registry.

Registering a version logs the package to its release run (`package/`, what serve, rollback and deploy
fetch and verify) and an MLflow model (the LoggedModel a version points at, which MLflow's own loaders read).
Both used to hold the weights: two copies of the largest files in the artifact store. Now the LoggedModel
holds them (MLflow copies them there verbatim: release/registry/runs.py), the release run's `package/`
holds every other file, and `package.links.json` beside it names where each left-out file lives:

    {"model_id": "m-...", "files": {"model/weights.data": "weights.data"}}

Fetching a package fills those files in from the LoggedModel before the manifest check, which covers them
like every other file (digest anchored in the registry), so a link cannot smuggle in other bytes. Versions
registered before this have no links file and keep their whole `package/`.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from release.core.errors import RegistryError

LINKS_FILE = "package.links.json"
# JSON files stay in `package/` too: `relctl deploy` reads the config files from it without the weights.
KEPT_SUFFIXES = (".json",)


def links(package_root: Path, model_dir: Path, verbatim: tuple[str, ...]) -> dict[str, str]:
    """package-relative path -> LoggedModel artifact name, for the files the LoggedModel holds verbatim
    (the weights), but for the config files."""
    out: dict[str, str] = {}
    for name in verbatim:
        path = model_dir / name
        if path.is_file() and not name.endswith(KEPT_SUFFIXES):
            out[path.relative_to(package_root).as_posix()] = name
    return out


def links_uri(package_uri: str) -> str:
    """`runs:/<run>/package` -> `runs:/<run>/package.links.json`."""
    return f"{package_uri.rstrip('/').rsplit('/', 1)[0]}/{LINKS_FILE}"


def read_links(downloaded: Path) -> tuple[str, dict[str, str]]:
    data = json.loads(downloaded.read_text())
    files = data.get("files")
    model_id = data.get("model_id")
    if not isinstance(model_id, str) or not isinstance(files, dict):
        raise RegistryError(f"{LINKS_FILE}: malformed (no model_id or files)")
    for relative in files:
        parts = PurePosixPath(relative).parts
        if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
            raise RegistryError(f"{LINKS_FILE}: {relative!r} is not a path inside the package")
    return model_id, {str(k): str(v) for k, v in files.items()}
