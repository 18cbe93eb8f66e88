"""The one MLflow seam: runs, artifacts, registered models, versions, tags and aliases.

Nothing else in relctl calls MLflow; every failure of MLflow becomes a RegistryError (exit 4), and a
missing run or model an InputError (exit 2).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path, PurePosixPath

import mlflow.artifacts
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from release.core.errors import InputError, RegistryError
from release.core.model_name import check_model_name, check_version_number, is_reserved_name
from release.registry import aliases as al
from release.registry import filters as fl
from release.registry import lock as lk
from release.registry import runs, states
from release.registry import tags as T
from release.registry.model_page import model_page
from release.registry.records import (
    ModelRecord,
    RunRecord,
    VersionRecord,
    model_record,
    run_record,
    version_record,
)
from release.registry.store import (
    Store,
    connect,
    ensure_experiment,
    require_existing,
    resolve_store,
    stray_store_hint,
)

PRODUCTION = "production"
PREVIOUS = "previous"
CANDIDATE = "candidate"
Decide = Callable[[dict[str, str]], dict[str, str | None]]
MODEL_VERSIONS_TAG = "mlflow.modelVersions"   # MLflow's own LoggedModel -> versions link (mlflow_tags)


def _not_found(exc: MlflowException) -> bool:
    return exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE")


def safe_artifact_path(path: str) -> str:
    """A run-relative artifact path; anything that could leave the run (.., absolute, ~) is bad input."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or path.startswith("~") or "\\" in path:
        raise InputError(f"artifact path '{path}' points outside the run",
                         hint="use a path relative to the run's artifact root, e.g. 'checkpoint'")
    return pure.as_posix()


def logged_model_id(mv: VersionRecord) -> str | None:
    """The LoggedModel behind a version. The SQL registry does not keep `model_id`; the source names it."""
    if getattr(mv, "model_id", None):
        return str(mv.model_id)
    source = str(mv.source or "")
    if source.startswith("models:/m-"):
        return source.removeprefix("models:/").split("/", 1)[0]
    return None


def _check_version_tags(tags: dict[str, str]) -> None:
    # The versions table of the registry UI stays readable only if versions carry the documented tags.
    extra = sorted(k for k in tags if not T.is_version_tag(k))
    if extra:
        raise ValueError(f"not a documented model-version tag: {', '.join(extra)} (see release/registry/tags.py)")


def _metrics(values: dict[str, float], model_id: str | None, run_id: str) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(key, value, now, 0, model_id=model_id, run_id=run_id) for key, value in sorted(values.items())]


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def refuse_symlinks(root: Path) -> None:
    """A downloaded artifact tree must hold plain files: a symlink could point anywhere on this machine."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            raise InputError(f"artifact '{path.relative_to(root.parent)}' is a symbolic link",
                             hint="log the file itself, not a link to it (a link can point anywhere on a host)")


class Registry:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.client = MlflowClient(tracking_uri=store.tracking_uri, registry_uri=store.tracking_uri)

    # --- training runs and artifacts -------------------------------------------------------------
    def get_run(self, run_id: str) -> RunRecord:
        try:
            return run_record(self.client.get_run(run_id))
        except MlflowException as exc:
            if _not_found(exc):
                raise InputError(
                    f"run '{run_id}' not found in {self.store.display_uri}"
                    + ("" if "MLFLOW_TRACKING_URI" in os.environ else " (relctl's store for this project)"),
                    hint=stray_store_hint(self.store)
                    or "check the run id in the MLflow UI, or set MLFLOW_TRACKING_URI to the store that has it",
                ) from exc
            raise RegistryError(f"cannot read run '{run_id}': {exc.message}") from exc

    def experiment_name(self, experiment_id: str) -> str:
        return str(self.client.get_experiment(experiment_id).name)

    def list_artifacts(self, run_id: str, path: str, run: RunRecord | None = None) -> list[str]:
        """Artifact paths directly under `path`. With `run` (already read), its own artifact store is listed
        directly: MLflow's run listing reads the run again and searches its LoggedModels on every call.
        Only an empty answer asks MLflow the long way (a checkpoint logged as a LoggedModel)."""
        relative = safe_artifact_path(path)
        try:
            if run is not None:
                from mlflow.store.artifact.artifact_repository_registry import (  # noqa: PLC0415 - loaded by mlflow
                    get_artifact_repository,
                )

                repo = get_artifact_repository(run.artifact_uri, tracking_uri=self.store.tracking_uri)
                own = [a.path for a in repo.list_artifacts(relative)]
                if own:
                    return own
            return [a.path for a in self.client.list_artifacts(run_id, relative)]
        except MlflowException as exc:
            raise RegistryError(f"cannot list artifacts of run '{run_id}': {exc.message}") from exc

    def download_run_artifact(self, run_id: str, path: str, dest: Path) -> Path:
        relative = safe_artifact_path(path)
        self._refuse_local_symlinks(run_id, relative)
        try:
            local = Path(mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=relative, dst_path=str(dest), tracking_uri=self.store.tracking_uri))
        except MlflowException as exc:
            raise RegistryError(f"cannot download '{relative}' of run '{run_id}': {exc.message}") from exc
        refuse_symlinks(local)
        return local

    def _refuse_local_symlinks(self, run_id: str, relative: str) -> None:
        """A file-based artifact store can hold links (MLflow then fails to copy them): name the link."""
        uri = self.get_run(run_id).artifact_uri
        if not uri.startswith("file://"):
            return
        root = Path(uri.removeprefix("file://"))
        target = root / relative
        for candidate in [target, *(target.rglob("*") if target.is_dir() and not target.is_symlink() else [])]:
            if candidate.is_symlink():
                raise InputError(f"artifact '{candidate.relative_to(root)}' is a symbolic link",
                                 hint="log the file itself, not a link to it (a link can point anywhere on a host)")

    def download_uri(self, uri: str, dest: Path) -> Path:
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest),
                                                             tracking_uri=self.store.tracking_uri))
        except MlflowException as exc:  # e.g. a tracking server whose object store is down answers 500
            raise RegistryError(f"cannot download '{uri}' through {self.store.display_uri}: {exc.message}",
                                hint="check that the artifact store behind the tracking server is up, "
                                     "then run the command again") from exc
        refuse_symlinks(local)
        return local

    # --- release runs --------------------------------------------------------------------------------
    def releases_experiment(self) -> str:
        try:
            return ensure_experiment(self.store, runs.RELEASE_EXPERIMENT)
        except MlflowException as exc:
            raise RegistryError(f"cannot read experiment '{runs.RELEASE_EXPERIMENT}': {exc.message}",
                                hint="check that the tracking server is up, then run the command again") from exc

    def release_run(self, model: str, run_name: str, tags: dict[str, str]) -> AbstractContextManager[runs.ReleaseRun]:
        experiment_id = self.releases_experiment()
        mlflow.set_experiment(experiment_id=experiment_id)
        return runs.release_run(experiment_id, run_name, {T.MODEL: model, **tags})

    def release_in_flight(self, run_id: str) -> bool:
        try:
            return runs.in_flight(self.client, run_id)
        except MlflowException as exc:
            if _not_found(exc):
                return False
            raise RegistryError(f"cannot read release run '{run_id}': {exc.message}") from exc

    def reap_dead_runs(self, model: str) -> list[str]:
        return runs.reap_dead_runs(self.client, self.releases_experiment(), model)

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
        check_model_name(name, "model", hint="`relctl status` lists the registered models")
        if not self.model_exists(name):
            raise InputError(
                f"registered model '{name}' not found in {self.store.display_uri}",
                hint="run `relctl status` without a name to list models, or promote a run first",
            )

    def read_model(self, name: str) -> ModelRecord:
        """`name` in one query: its aliases and its tags (the alias history); InputError when it does not exist.

        The read commands start here and query nothing else about the model unless a move is pending."""
        try:
            return model_record(self.client.get_registered_model(name))
        except MlflowException as exc:
            if _not_found(exc):
                raise InputError(
                    f"registered model '{name}' not found in {self.store.display_uri}",
                    hint="run `relctl status` without a name to list models, or promote a run first",
                ) from exc
            raise RegistryError(f"cannot read registered model '{name}': {exc.message}") from exc

    def sweep_if_pending(self, model: ModelRecord) -> list[str]:
        """Reap dead release runs and repair half-done moves, only when `model` (just read) has a pending
        move: a crashed process leaves one before it moves any alias, so a model without one has nothing to
        repair, and a reader skips the lock, the runs search and the rewrite of the model page."""
        if not al.has_pending(dict(model.tags)):
            return []
        return [*self.reap_dead_runs(model.name), *self.repair(model.name)]

    def list_models(self) -> list[str]:
        # Only a proven lease is hidden: a model someone named `relctl.lock.*` in MLflow is still listed.
        return sorted(m.name for m in self.client.search_registered_models()
                      if not (is_reserved_name(m.name) and lk.is_lease(dict(m.tags))))

    def ensure_model(self, name: str, description: str) -> None:
        check_model_name(name, "registered model")
        if not self.model_exists(name):
            try:
                self.client.create_registered_model(name, description=description)
            except MlflowException as exc:
                # Another relctl created it between the check and the create (two first promotes at once).
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise RegistryError(f"cannot create registered model '{name}': {exc.message}") from exc

    def aliases(self, name: str) -> dict[str, str]:
        return {alias: str(v) for alias, v in self.client.get_registered_model(name).aliases.items()}

    def version_for(self, name: str, alias: str) -> VersionRecord | None:
        try:
            return version_record(self.client.get_model_version_by_alias(name, alias))
        except MlflowException as exc:
            if _not_found(exc):
                return None
            raise RegistryError(f"cannot read alias '{alias}' of '{name}': {exc.message}") from exc

    def get_version(self, name: str, version: str) -> VersionRecord:
        # get_model_version carries aliases and tags; search_model_versions does not.
        check_version_number(version, f"{name} v{version}")
        try:
            return version_record(self.client.get_model_version(name, version))
        except MlflowException as exc:
            if _not_found(exc):
                raise InputError(f"{name} v{version} not found",
                                 hint=f"`relctl status {name}` lists its aliases") from exc
            raise RegistryError(f"cannot read {name} v{version}: {exc.message}") from exc

    def find_versions(self, name: str, tag: str, value: str) -> list[VersionRecord]:
        """Versions of `name` whose tag `tag` equals `value`, oldest first (full objects, tags included)."""
        query = f"name = {fl.literal(name)} and tags.{fl.identifier(tag)} = {fl.literal(value)}"
        try:
            found = self.client.search_model_versions(query)
        except MlflowException as exc:
            raise RegistryError(f"cannot search the versions of '{name}': {exc.message}") from exc
        return sorted((self.get_version(name, str(v.version)) for v in found), key=lambda v: int(v.version))

    def models_tagged(self, tags: dict[str, str]) -> list[str]:
        """The registered models with a version carrying every tag in `tags`, in one search across models
        (serve and rollback ask which adapters name a base version; one query, however many models exist)."""
        query = " and ".join(f"tags.{fl.identifier(k)} = {fl.literal(v)}" for k, v in sorted(tags.items()))
        try:
            found = self.client.search_model_versions(query)
        except MlflowException as exc:
            raise RegistryError(f"cannot search the registry's versions: {exc.message}") from exc
        return sorted({str(v.name) for v in found})

    def engine_labels(self, name: str) -> dict[str, str]:
        """{version: "engine precision"} for every version of `name`, in one search (rollback and history name
        the engines they move between)."""
        try:
            found = self.client.search_model_versions(f"name = {fl.literal(name)}")
        except MlflowException as exc:
            raise RegistryError(f"cannot search the versions of '{name}': {exc.message}") from exc
        return {str(v.version): T.engine_label(dict(v.tags or {})) for v in found}

    def version_tags(self, name: str) -> dict[str, dict[str, str]]:
        """{version: its tags} for every version of `name`, in one search (registry/kinds.py: which kind of
        release a name holds)."""
        try:
            found = self.client.search_model_versions(f"name = {fl.literal(name)}")
        except MlflowException as exc:
            raise RegistryError(f"cannot search the versions of '{name}': {exc.message}") from exc
        return {str(v.version): dict(v.tags or {}) for v in found}

    def versions(self, name: str) -> list[VersionRecord]:
        """Every version of `name`, oldest first (`relctl sign` walks them)."""
        try:
            found = self.client.search_model_versions(f"name = {fl.literal(name)}")
        except MlflowException as exc:
            raise RegistryError(f"cannot search the versions of '{name}': {exc.message}") from exc
        return sorted((self.get_version(name, str(v.version)) for v in found), key=lambda v: int(v.version))

    def add_run_files(self, run_id: str, files: list[Path], artifact_path: str) -> None:
        """Add files under `artifact_path` of a finished run (`relctl sign`: a signature for an older package)."""
        relative = safe_artifact_path(artifact_path)
        try:
            for path in files:
                self.client.log_artifact(run_id, str(path), relative)
        except MlflowException as exc:
            raise RegistryError(f"cannot add files to '{relative}' of run '{run_id}': {exc.message}") from exc

    def create_version(self, name: str, model_uri: str, run_id: str, tags: dict[str, str], description: str,
                       model_id: str | None = None) -> VersionRecord:
        # source must be the logged model's URI: a runs:/ source makes a version that does not load.
        _check_version_tags(tags)
        try:
            mv = self.client.create_model_version(name, source=model_uri, run_id=run_id, tags=tags,
                                                  description=description, model_id=model_id)
            record = version_record(mv)
            self._link_logged_model(record)
        except MlflowException as exc:
            raise RegistryError(f"cannot create a version of '{name}': {exc.message}") from exc
        return record

    def _link_logged_model(self, mv: VersionRecord) -> None:
        """Name the version on its LoggedModel, as mlflow.register_model does (the client call does not): the
        LoggedModel's page, which lists the version's metrics, then links back to the version."""
        model_id = logged_model_id(mv)
        if model_id is None:
            return
        existing = self.client.get_logged_model(model_id).tags.get(MODEL_VERSIONS_TAG)
        linked = [*json.loads(existing or "[]"), {"name": mv.name, "version": str(mv.version)}]
        self.client.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps(linked)})

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.set_version_tags(name, version, {key: value})

    def set_version_tags(self, name: str, version: str, tags: dict[str, str]) -> None:
        _check_version_tags(tags)
        for key, value in tags.items():
            self.client.set_model_version_tag(name, version, key, value[:T.TAG_VALUE_MAX])

    # --- a version's numbers: metrics of its LoggedModel ----------------------------------------------
    def record_numbers(self, mv: VersionRecord, run_id: str, metrics: dict[str, float],
                       details: dict[str, str]) -> None:
        """`metrics` onto the version's LoggedModel (the version page shows them) through release run
        `run_id`; `details` (digests, not numbers) as the LoggedModel's tags. A re-gate logs newer values."""
        model_id = logged_model_id(mv)
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        try:
            if model_id is None:  # registered before MLflow 3's LoggedModels: the release run keeps them
                self.client.log_batch(run_id, metrics=_metrics(finite, None, run_id))
                return
            self.client.log_batch(run_id, metrics=_metrics(finite, model_id, run_id))
            if details:
                self.client.set_logged_model_tags(model_id, {k: v[:T.TAG_VALUE_MAX] for k, v in details.items()})
        except MlflowException as exc:
            raise RegistryError(f"cannot record the metrics of {mv.name} v{mv.version}: {exc.message}") from exc

    def recorded_numbers(self, mv: VersionRecord, run: RunRecord | None = None
                         ) -> tuple[dict[str, float], dict[str, str]]:
        """The newest value of each metric recorded for the version, and its LoggedModel's tags.

        Versions registered before metrics moved off tags carry their numbers as tags: read those too.
        `run`: the version's release run when the caller has read it already (not read again)."""
        legacy = {k: _float(v) for k, v in mv.tags.items()
                  if k.startswith((T.VALIDATION_PREFIX, T.GATE_PREFIX)) and not T.is_version_tag(k)}
        metrics = {k: v for k, v in legacy.items() if v is not None}
        details = {k: mv.tags[k] for k, v in legacy.items() if v is None}
        model_id = logged_model_id(mv)
        if model_id:
            try:
                logged = self.client.get_logged_model(model_id)
            except MlflowException as exc:
                raise RegistryError(f"cannot read the metrics of {mv.name} v{mv.version}: {exc.message}") from exc
            newest: dict[str, tuple[int, float]] = {}
            for metric in logged.metrics or []:
                if metric.key not in newest or metric.timestamp >= newest[metric.key][0]:
                    newest[metric.key] = (metric.timestamp, float(metric.value))
            metrics |= {k: v for k, (_, v) in newest.items()}
            details |= {k: v for k, v in (logged.tags or {}).items() if not k.startswith("mlflow.")}
        elif mv.run_id:  # no LoggedModel: record_numbers logged them to the release run
            prefixes = (T.VALIDATION_PREFIX, T.GATE_PREFIX, T.MEMORY_PREFIX)
            if run is None or run.run_id != mv.run_id:
                run = self.get_run(mv.run_id)
            metrics |= {k: float(v) for k, v in run.metrics.items() if k.startswith(prefixes)}
        return metrics, details

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        """A tag on the registered model `name` (a running server's record: release/registry/servers.py)."""
        try:
            self.client.set_registered_model_tag(name, key, value[:T.TAG_VALUE_MAX])
        except MlflowException as exc:
            raise RegistryError(f"cannot tag registered model '{name}': {exc.message}") from exc

    def delete_model_tag(self, name: str, key: str) -> None:
        try:
            self.client.delete_registered_model_tag(name, key)
        except MlflowException as exc:
            if not _not_found(exc):
                raise RegistryError(f"cannot remove tag '{key}' of '{name}': {exc.message}") from exc

    def set_description(self, name: str, version: str, description: str) -> None:
        self.client.update_model_version(name, version, description=description)

    # --- aliases and their history ---------------------------------------------------------------
    def lock(self, name: str, purpose: str) -> AbstractContextManager[None]:
        return lk.model_lock(self.client, name, purpose)

    def locked_move(self, name: str, decide: Decide, action: str, reason: str,
                    release_run: str | None, override: bool = False, user: str | None = None
                    ) -> tuple[al.AliasMove | None, list[str]]:
        """Under the model's lock: repair half-done moves, let `decide(current aliases)` choose, check each
        target against the alias state rule (registry/states.py), move.

        Returns the move (None when it would change nothing: a no-op is not recorded) and repair notes.
        """
        with self.lock(name, action):
            notes = al.repair_pending(self.client, name, lambda: self.aliases(name))
            current = self.aliases(name)
            wanted = decide(current)
            forced = self._check_targets(name, current, wanted, release_run, override)
            if forced:
                reason = f"{reason} (forced with {states.OVERRIDE_FLAG}: {'; '.join(forced)})"
            move = al.apply_move(self.client, name, current, wanted, action, reason, release_run, user)
        if move is not None or notes:
            self.refresh_model_page(name)
        return move, notes

    def _check_targets(self, name: str, current: dict[str, str], wanted: dict[str, str | None],
                       release_run: str | None, override: bool) -> list[str]:
        """Refuse (exit 2) a move the state rule forbids, unless overridden: then the refusals, for the record."""
        refusals = []
        for alias, version in wanted.items():
            if version is None or current.get(alias) == version:
                continue
            refusal = states.alias_refusal(alias, version, self.get_version(name, version).tags, release_run)
            if refusal is not None:
                refusals.append(refusal)
        if refusals and not override:
            raise InputError(f"{name}: {refusals[0]}",
                             hint="only a version that passed its gates may serve; pass "
                                  f"`relctl rollback --to VERSION {states.OVERRIDE_FLAG}` to move production to "
                                  "it anyway (recorded in the history)")
        return refusals

    def move_aliases(self, name: str, changes: dict[str, str | None], action: str, reason: str,
                     release_run: str | None) -> al.AliasMove | None:
        """Point each alias at its version (None deletes it), serialized and recorded in the history."""
        move, _ = self.locked_move(name, lambda _current: dict(changes), action, reason, release_run)
        return move

    def record_event(self, name: str, action: str, reason: str, release_run: str | None) -> al.AliasMove:
        with self.lock(name, action):
            event = al.record_event(self.client, name, action, reason, release_run)
        self.refresh_model_page(name)
        return event

    def repair(self, name: str) -> list[str]:
        """Repair what a dead process left half-done on `name`'s aliases (one note per repair)."""
        if not self.model_exists(name):
            return []
        if not any(m.state == "pending" for m in al.read_history(self.client, name, include_abandoned=True)):
            return []
        with self.lock(name, "repair"):
            notes = al.repair_pending(self.client, name, lambda: self.aliases(name))
        self.refresh_model_page(name)
        return notes

    def refresh_model_page(self, name: str) -> None:
        """Rewrite the registered model's description from its aliases and history (model_page.py).

        A view of the record, written after the move: if it cannot be written, the move still stands and
        the next move rewrites it, so a failure here is not the command's failure."""
        try:
            page = model_page(name, self.aliases(name), self.history(name), self.store.tracking_uri,
                              self.releases_experiment())
            self.client.update_registered_model(name, description=page)
        except (MlflowException, RegistryError):
            pass

    def replaced_by(self, name: str, version: str) -> str | None:
        """The version `version` replaced as production when it was last promoted (from relctl's history)."""
        replaced = None
        for move in self.history(name):
            change = move.changes.get(PRODUCTION)
            if move.action in ("promote", "canary") and change and change[1] == version:
                replaced = change[0]
        return replaced

    def history(self, name: str) -> list[al.AliasMove]:
        return al.read_history(self.client, name)


def open_registry(project_dir: Path, read_only: bool = False) -> Registry:
    """The registry of a project (its release.yaml's or MLFLOW_TRACKING_URI's store), connected for writes.
    `read_only`: a command that only reads refuses a local store that does not exist (never creates one)."""
    store = resolve_store(project_dir)
    if read_only:
        require_existing(store)
    connect(store)
    return Registry(store)
