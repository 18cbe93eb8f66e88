"""Everything that talks to MLflow: runs, artifacts, versions, tags, aliases, their history and lock."""

from __future__ import annotations

from release.registry.aliases import AliasMove
from release.registry.client import CANDIDATE, PREVIOUS, PRODUCTION, Registry, safe_artifact_path

__all__ = ["CANDIDATE", "PREVIOUS", "PRODUCTION", "AliasMove", "Registry", "safe_artifact_path"]
