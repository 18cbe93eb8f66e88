"""The package of an adapter alone: the engine's adapter files under model/, the run's config.json under
source/, and a manifest that names the backend, the kind and the base version (the weights stay the base's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.backends.base import Backend

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class AdapterPackaging:
    """release.core.package's view of the backend for an adapter folder: its files, its identity."""

    backend: Backend
    base_content_sha256: str

    @property
    def id(self) -> str:
        return self.backend.id

    @property
    def runtime_files(self) -> tuple[str, ...]:
        return ADAPTER_FILES

    def version(self) -> str:
        return self.backend.version()

    def runtime_config(self, model_dir: Path) -> dict[str, Any]:
        # The serving config of an adapter is its base's package and the engine that applies it unmerged.
        return {"engine": self.backend.id, "engine_version": self.backend.version(), "kind": "adapter",
                "base_package_content_sha256": self.base_content_sha256}
