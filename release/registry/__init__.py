"""Everything that talks to MLflow: runs, artifacts, versions, tags, aliases, their history and lock.

The names below load on first use (PEP 562): `release.registry.store` and `release.registry.tags` are read
by commands that must start without importing MLflow, and importing them must not import the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from release.registry.aliases import AliasMove
    from release.registry.client import CANDIDATE, PREVIOUS, PRODUCTION, Registry, safe_artifact_path

__all__ = ["CANDIDATE", "PREVIOUS", "PRODUCTION", "AliasMove", "Registry", "safe_artifact_path"]


def __getattr__(name: str) -> Any:
    if name == "AliasMove":
        from release.registry.aliases import AliasMove  # noqa: PLC0415 - lazy by design, see above

        return AliasMove
    if name in __all__:
        from release.registry import client  # noqa: PLC0415 - lazy by design, see above

        return getattr(client, name)
    raise AttributeError(f"module 'release.registry' has no attribute {name!r}")
