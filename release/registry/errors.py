"""MLflow's exceptions seen from outside the registry: a failed MLflow call becomes a RegistryError (exit 4)
here, so no other package needs to know MLflow's exception types."""

from __future__ import annotations

from mlflow.exceptions import MlflowException

from release.core.errors import RegistryError


def as_registry_error(exc: BaseException, doing: str) -> RegistryError | None:
    """`exc` as a RegistryError naming what was being done, when it is an MLflow failure; else None."""
    if isinstance(exc, MlflowException):
        return RegistryError(f"{doing}: {exc.message}")
    return None
