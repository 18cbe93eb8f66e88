"""Production and candidate packages behind `relctl serve`, each on its own port of 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from release.canary.settings import CanaryConfig
from release.core.errors import InputError
from release.serving.process import ServerProcess


def server_config_file(work: Path, config: CanaryConfig) -> Path | None:
    """gates.canary.server as a release.yaml for both servers (None: each package's own settings)."""
    if config.server is None:
        return None
    work.mkdir(parents=True, exist_ok=True)
    path = work / "server-config.yaml"
    path.write_text(yaml.safe_dump({"serving": {"server": config.server.model_dump()}}))
    return path


@contextlib.contextmanager
def served(production: Path, candidate: Path, work: Path, config: CanaryConfig
           ) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Both packages served (checksums verified by `relctl serve`); stopped gracefully on exit."""
    for path in (production, candidate):
        if not (path / "relctl-package.json").is_file():
            raise InputError(f"{path}: not a relctl package (no relctl-package.json)",
                             hint="pass a folder made by `relctl package` or promote")
    work.mkdir(parents=True, exist_ok=True)
    server_config = server_config_file(work, config)
    with ServerProcess(str(production), work / "production", config=server_config, project_dir=work) as prod, \
         ServerProcess(str(candidate), work / "candidate", config=server_config, project_dir=work) as cand:
        yield prod, cand
