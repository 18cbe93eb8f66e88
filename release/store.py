"""Where MLflow lives: the embedded SQLite store under the project folder, or MLFLOW_TRACKING_URI.

MLflow's own defaults depend on the current directory (./mlruns); relctl never relies on them and
always sets the tracking URI, the registry URI and each experiment's artifact location explicitly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STATE_DIR = ".relctl"


@dataclass(frozen=True)
class Store:
    tracking_uri: str
    # Artifact root for experiments relctl creates; None lets a tracking server choose (--default-artifact-root).
    artifact_root: str | None
    embedded: bool

    def artifact_location(self, experiment_name: str) -> str | None:
        if self.artifact_root is None:
            return None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in experiment_name)
        return f"{self.artifact_root}/{safe}"


def resolve_store(project_dir: Path, environ: dict[str, str] | None = None) -> Store:
    """The store for `project_dir`: MLFLOW_TRACKING_URI when set, else the embedded SQLite store."""
    env = os.environ if environ is None else environ
    uri = env.get("MLFLOW_TRACKING_URI")
    if uri:
        return Store(tracking_uri=uri, artifact_root=None, embedded=False)
    state = (project_dir / STATE_DIR).resolve()
    return Store(
        tracking_uri=f"sqlite:///{state / 'mlflow.db'}",
        artifact_root=(state / "artifacts").as_uri(),
        embedded=True,
    )


def connect(store: Store) -> None:
    """Point the mlflow module at `store` (tracking and registry both, explicitly)."""
    import mlflow

    if store.embedded:
        db_path = Path(store.tracking_uri.removeprefix("sqlite:///"))
        db_path.parent.mkdir(parents=True, exist_ok=True)
    # mlflow.set_*_uri also export MLFLOW_TRACKING_URI/MLFLOW_REGISTRY_URI into os.environ; that would
    # make the next resolve_store() mistake relctl's own choice for the user's. MLflow's module-level
    # URI wins over the variable, so restoring the environment keeps both right.
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(store.tracking_uri)
    mlflow.set_registry_uri(store.tracking_uri)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def ensure_experiment(store: Store, name: str) -> str:
    """Id of experiment `name`, created with an explicit artifact location when missing."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.tracking_uri, registry_uri=store.tracking_uri)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    return str(client.create_experiment(name, artifact_location=store.artifact_location(name)))
