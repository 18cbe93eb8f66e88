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
    """release.yaml (`-c FILE` resolved against the project folder, else PROJECT_DIR/release.yaml when one is
    there: release.config.config_path) and the gates' blocks: ConfigError (exit 2) on the first thing wrong,
    naming the file read (a -c file by its own name), nothing read from a registry or a model."""
    from release.config import config_label, errors_name, load_config  # noqa: PLC0415 - pydantic: not at import
    from release.config import config_path as resolve_config  # noqa: PLC0415 - as above
    from release.gating.plugins import load_gates  # noqa: PLC0415 - as above

    path = resolve_config(project_dir, config_path)
    cfg = load_config(path, overrides)
    with errors_name(config_label(cfg)):
        return Preflight(cfg, path, load_gates(cfg.gates, config_label(cfg)))  # every gate validates its block
