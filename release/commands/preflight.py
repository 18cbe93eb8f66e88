"""What `relctl promote` and `relctl check` refuse before they open a registry: release.yaml (parsed and
validated, command-line overrides applied) and each gate's block.

Kept apart from release/commands/api.py, which imports the registry client and with it MLflow (about 3 s
of imports on a quiet core, 15-28 s on a loaded one): a bad flag value or a bad release.yaml is answered
from here at about the cost of `relctl --help` (benchmarks/refusal_latency.py), and the command imports
api only once this has passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from release.config import ReleaseConfig
    from release.gating.contract import Gate


@dataclass(frozen=True)
class Preflight:
    cfg: ReleaseConfig
    config_path: Path | None  # the release.yaml read (None: defaults only)
    gates: list[Gate]

    @property
    def config_dir(self) -> Path | None:
        return self.config_path.parent if self.config_path else None


def preflight(project_dir: Path, config_path: Path | None, overrides: dict[str, Any] | None = None) -> Preflight:
    """release.yaml (PROJECT_DIR/release.yaml when `config_path` is None and one is there) and the gates'
    blocks: ConfigError (exit 2) on the first thing wrong, nothing read from a registry or a model."""
    from release.config import CONFIG_FILE, load_config  # noqa: PLC0415 - pydantic: not at import time
    from release.gating.plugins import load_gates  # noqa: PLC0415 - as above

    if config_path is None and (project_dir / CONFIG_FILE).is_file():
        config_path = project_dir / CONFIG_FILE
    cfg = load_config(config_path, overrides)
    return Preflight(cfg, config_path, load_gates(cfg.gates))  # every gate validates its block now
