"""Production and candidate packages behind `relctl serve`, each on its own port of 127.0.0.1.

Registered versions are served by their registry reference (`models:/MODEL/VERSION` in the project), so
every answer's X-Relctl-Model / X-Relctl-Version headers name the version that gave it, as in production,
and the project's trusted keys check each one's signature. Package folders that are no registered
versions (the standalone gate's baseline and candidate) are served as folders, their answers marked
`unregistered`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from release.canary.settings import CanaryConfig
from release.core.errors import InputError
from release.serving.process import ServerProcess


@dataclass(frozen=True)
class Registered:
    """The two sides as registered versions of `model` in the registry of `project_dir`."""

    project_dir: Path
    model: str
    production_version: str
    candidate_version: str


def server_config_file(work: Path, config: CanaryConfig) -> Path | None:
    """gates.canary.server as a release.yaml for both servers (None: each package's own settings)."""
    if config.server is None:
        return None
    work.mkdir(parents=True, exist_ok=True)
    path = work / "server-config.yaml"
    path.write_text(yaml.safe_dump({"serving": {"server": config.server.model_dump()}}))
    return path


@contextlib.contextmanager
def served(production: Path, candidate: Path, work: Path, config: CanaryConfig, registered: Registered | None = None
           ) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Both packages served (checksums verified by `relctl serve`); stopped gracefully on exit."""
    for path in (production, candidate):
        if not (path / "relctl-package.json").is_file():
            raise InputError(f"{path}: not a relctl package (no relctl-package.json)",
                             hint="pass a folder made by `relctl package` or promote")
    work.mkdir(parents=True, exist_ok=True)
    server_config = server_config_file(work, config)
    if registered is None:
        specs, project = [str(production), str(candidate)], work
    else:
        # Fetched again into the project's serve cache and verified against the registry's digest there.
        specs = [f"models:/{registered.model}/{v}" for v in (registered.production_version,
                                                             registered.candidate_version)]
        project = registered.project_dir
    with ServerProcess(specs[0], work / "production", config=server_config, project_dir=project) as prod, \
         ServerProcess(specs[1], work / "candidate", config=server_config, project_dir=project) as cand:
        yield prod, cand
