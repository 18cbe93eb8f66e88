"""Everything that talks to the MLflow Model Registry: versions, tags, aliases and alias history.

MLflow keeps no alias history, so relctl records every move as a registered-model tag
`relctl.history.<utc timestamp>.<nonce>` holding JSON; tags work against any tracking server.
"""

from __future__ import annotations

import getpass
import json
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from mlflow.entities import Run
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from release.errors import InputError, RegistryError
from release.store import Store

HISTORY_PREFIX = "relctl.history."
PRODUCTION = "production"
PREVIOUS = "previous"


@dataclass(frozen=True)
class AliasMove:
    """One release event: every alias it changed, as {alias: [from_version, to_version]}."""

    at: str
    action: str
    changes: dict[str, list[str | None]]
    reason: str
    release_run: str | None = None
    user: str = field(default_factory=lambda: _user())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers; the move is still worth recording
        return "unknown"


def _not_found(exc: MlflowException) -> bool:
    return exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE")


class Registry:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.client = MlflowClient(tracking_uri=store.tracking_uri, registry_uri=store.tracking_uri)

    # --- training runs -------------------------------------------------------------------------
    def get_run(self, run_id: str) -> Run:
        try:
            return self.client.get_run(run_id)
        except MlflowException as exc:
            if _not_found(exc):
                raise InputError(
                    f"run '{run_id}' not found in {self.store.tracking_uri}",
                    hint="check the run id in the MLflow UI, or set MLFLOW_TRACKING_URI to the store that has it",
                ) from exc
            raise RegistryError(f"cannot read run '{run_id}': {exc.message}") from exc

    # --- registered models and versions -------------------------------------------------------
    def model_exists(self, name: str) -> bool:
        try:
            self.client.get_registered_model(name)
            return True
        except MlflowException as exc:
            if _not_found(exc):
                return False
            raise RegistryError(f"cannot read registered model '{name}': {exc.message}") from exc

    def require_model(self, name: str) -> None:
        if not self.model_exists(name):
            raise InputError(
                f"registered model '{name}' not found in {self.store.tracking_uri}",
                hint="run `relctl status` without a name to list models, or promote a run first",
            )

    def list_models(self) -> list[str]:
        return sorted(m.name for m in self.client.search_registered_models())

    def ensure_model(self, name: str, description: str) -> None:
        if not self.model_exists(name):
            self.client.create_registered_model(name, description=description)

    def aliases(self, name: str) -> dict[str, str]:
        return {alias: str(v) for alias, v in self.client.get_registered_model(name).aliases.items()}

    def version_for(self, name: str, alias: str) -> ModelVersion | None:
        try:
            return self.client.get_model_version_by_alias(name, alias)
        except MlflowException as exc:
            if _not_found(exc):
                return None
            raise RegistryError(f"cannot read alias '{alias}' of '{name}': {exc.message}") from exc

    def get_version(self, name: str, version: str) -> ModelVersion:
        # get_model_version carries aliases and tags; search_model_versions does not.
        return self.client.get_model_version(name, version)

    def create_version(
        self, name: str, model_uri: str, run_id: str, tags: dict[str, str], description: str,
        model_id: str | None = None,
    ) -> ModelVersion:
        # source must be the logged model's URI: a runs:/ source makes a version that does not load.
        try:
            mv = self.client.create_model_version(
                name, source=model_uri, run_id=run_id, tags=tags, description=description, model_id=model_id
            )
        except MlflowException as exc:
            raise RegistryError(f"cannot create a version of '{name}': {exc.message}") from exc
        return mv

    # --- aliases and their history ---------------------------------------------------------------
    def move_aliases(
        self,
        name: str,
        changes: dict[str, str | None],
        action: str,
        reason: str,
        release_run: str | None,
    ) -> AliasMove:
        """Point each alias at its version (None deletes it) and record the move in the history."""
        current = self.aliases(name)
        move = AliasMove(
            at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            action=action,
            changes={alias: [current.get(alias), to] for alias, to in changes.items()},
            reason=reason,
            release_run=release_run,
        )
        try:
            for alias, version in changes.items():
                if version is None:
                    if alias in current:
                        self.client.delete_registered_model_alias(name, alias)
                else:
                    self.client.set_registered_model_alias(name, alias, version)
            key = f"{HISTORY_PREFIX}{move.at.replace(':', '').replace('+0000', 'Z')}.{secrets.token_hex(3)}"
            self.client.set_registered_model_tag(name, key, move.to_json())
        except MlflowException as exc:
            raise RegistryError(f"cannot move aliases of '{name}': {exc.message}") from exc
        return move

    def promote(self, name: str, version: str, reason: str, release_run: str | None) -> AliasMove:
        """`production` -> version; `previous` -> the version production pointed at before, if any."""
        current = self.version_for(name, PRODUCTION)
        changes: dict[str, str | None] = {PRODUCTION: version}
        if current is not None and str(current.version) != version:
            changes[PREVIOUS] = str(current.version)
        return self.move_aliases(name, changes, "promote", reason, release_run)

    def replaced_by(self, name: str, version: str) -> str | None:
        """The version `version` replaced as production when it was last promoted (from relctl's history)."""
        replaced = None
        for move in self.history(name):
            change = move.changes.get(PRODUCTION)
            if move.action == "promote" and change and change[1] == version:
                replaced = change[0]
        return replaced

    def history(self, name: str) -> list[AliasMove]:
        tags = self.client.get_registered_model(name).tags
        moves = []
        for key in sorted(k for k in tags if k.startswith(HISTORY_PREFIX)):
            data: dict[str, Any] = json.loads(tags[key])
            moves.append(AliasMove(**data))
        return moves
