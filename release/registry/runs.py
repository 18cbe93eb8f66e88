"""Release runs: each promote (or register) attempt is an MLflow run in `relctl-releases` holding its evidence.

A release run records the pid, host and process start time of the relctl that owns it, so a run left
RUNNING by a process that died (SIGKILL, a lost machine) is recognised by the next command that looks
and marked KILLED, with a note saying what happened.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import mlflow
import psutil
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.models.signature import ModelSignature
from mlflow.tracking import MlflowClient
from mlflow.types.schema import Schema, TensorSpec

from release.core.errors import RegistryError
from release.registry import filters
from release.registry import tags as T

RELEASE_EXPERIMENT = "relctl-releases"


class TensorInfo(Protocol):
    """One signature entry (release/backends/base.py TensorInfo, structurally: the registry sits below)."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


class FlavourModel(Protocol):
    """What a backend hands the registry to log with an MLflow flavour (release/backends/base.py FlavourModel)."""

    @property
    def model(self) -> Any: ...

    @property
    def inputs(self) -> Sequence[TensorInfo]: ...

    @property
    def outputs(self) -> Sequence[TensorInfo]: ...

    @property
    def side_files(self) -> Sequence[Path]: ...

    @property
    def log_options(self) -> dict[str, Any]: ...


@contextmanager
def _writing(what: str) -> Iterator[None]:
    """An MLflow failure while writing the release run is a RegistryError (exit 4), as everywhere else."""
    try:
        yield
    except MlflowException as exc:
        raise RegistryError(f"cannot {what} of the release run: {exc.message}",
                            hint="check that the tracking server is up, then run the command again") from exc


class ReleaseRun:
    """The active release run; every write to it goes through here."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def set_tags(self, tags: dict[str, str]) -> None:
        with _writing("set the tags"):
            mlflow.set_tags(tags)

    def log_params(self, params: dict[str, Any]) -> None:
        with _writing("log the params"):
            mlflow.log_params(params)

    def log_metrics(self, metrics: dict[str, float]) -> None:
        if metrics:
            with _writing("log the metrics"):
                mlflow.log_metrics(metrics)

    def log_artifact(self, path: Path, artifact_path: str) -> None:
        with _writing(f"log {artifact_path}/{path.name}"):
            mlflow.log_artifact(str(path), artifact_path)

    def log_artifacts(self, folder: Path, artifact_path: str, skip: frozenset[str] = frozenset()) -> None:
        """`folder` as `artifact_path/`, but for the files (paths relative to `folder`) in `skip`."""
        with _writing(f"log {artifact_path}/"):
            if not skip:
                mlflow.log_artifacts(str(folder), artifact_path)
                return
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                relative = path.relative_to(folder)
                if relative.as_posix() not in skip:
                    mlflow.log_artifact(str(path), "/".join([artifact_path, *relative.parent.parts]))

    def local_artifact(self, artifact_file: str) -> Path | None:
        """Where this run's artifact lies on this machine, when the artifact store is a local folder (the
        embedded store, a file: URI); None for a remote store (its UI link is the way to it)."""
        run = mlflow.active_run()
        uri = run.info.artifact_uri if run is not None and run.info.run_id == self.run_id else \
            MlflowClient().get_run(self.run_id).info.artifact_uri
        folder = _local_folder(str(uri))
        return None if folder is None else folder / artifact_file

    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        with _writing(f"log {artifact_file}"):
            mlflow.log_dict(data, artifact_file)

    def log_flavour_model(self, kind: str, flavoured: FlavourModel, extra_files: list[str],
                          requirements: list[str]) -> LoggedModelRef:
        """A model logged with MLflow's own `kind` flavour (`mlflow.<kind>.log_model`; a LoggedModel linked to
        this run) from the object its backend built, with a named TensorSpec signature and the runtime's pinned
        pip requirements, so it also loads with mlflow.pyfunc. The backend's side files (weights kept outside
        the model object) are copied beside it as they are: registering costs a file copy, not the model's size
        in memory."""
        import importlib  # noqa: PLC0415 - the flavour's module loads only when a version is registered

        try:
            module = importlib.import_module(f"mlflow.{kind}")
        except ImportError as exc:
            raise RegistryError(f"this MLflow has no '{kind}' flavour to log the model with",
                                hint=f"install MLflow's {kind} support, or use a backend that logs files") from exc
        signature = ModelSignature(inputs=_schema(flavoured.inputs), outputs=_schema(flavoured.outputs))
        with _writing(f"log the {kind} model"):
            info = module.log_model(flavoured.model, name="model", signature=signature,
                                    pip_requirements=requirements, extra_files=extra_files,
                                    **flavoured.log_options)
            model_id = getattr(info, "model_id", None)
            if flavoured.side_files and model_id is None:
                raise RegistryError(f"this MLflow has no LoggedModel to hold the {kind} model's side files",
                                    hint="use MLflow 3 (relctl pins mlflow>=3.17)")
            for path in flavoured.side_files:
                place_model_file(str(model_id), path)
        return LoggedModelRef(str(info.model_uri), model_id, tuple(path.name for path in flavoured.side_files))

    def log_files_model(self, files: list[Path], flavour: dict[str, Any]) -> LoggedModelRef:
        """A LoggedModel (linked to this run) whose artifacts are `files` and an MLmodel naming the `relctl`
        flavour: for backends whose engine loads its own folder (no MLflow flavour of its own). Files are
        linked or copied (`place_model_file`), never parsed, so registering costs no memory and at most a
        file copy."""
        client = MlflowClient()
        logged = mlflow.initialize_logged_model(name="model", source_run_id=self.run_id)
        with _writing("log the model's files"):
            for path in files:
                place_model_file(logged.model_id, path)
        with tempfile.TemporaryDirectory(prefix="relctl-model-") as tmp:
            folder = Path(tmp)
            model = Model(model_id=logged.model_id, run_id=self.run_id)
            model.add_flavor("relctl", **flavour, files=sorted(p.name for p in files))
            model.save(str(folder / "MLmodel"))
            client.log_model_artifacts(logged.model_id, str(folder))
        mlflow.finalize_logged_model(logged.model_id, "READY")
        return LoggedModelRef(f"models:/{logged.model_id}", logged.model_id, tuple(p.name for p in files))


def place_model_file(model_id: str, path: Path) -> None:
    """Put `path` at the root of LoggedModel `model_id`'s artifacts: a hard link when the artifact store is a
    local folder on the same filesystem (the registry and the release's work folder then share one copy of
    the weights on disk: relctl never writes a built file in place, its stages write a new folder and rename
    it), else MLflow's own upload (a copy). Measured: benchmarks/scaling.py, docs/disk-and-memory.md."""
    client = MlflowClient()
    target = _local_folder(str(client.get_logged_model(model_id).artifact_location))
    if target is not None:
        try:
            target.mkdir(parents=True, exist_ok=True)
            os.link(path, target / path.name)
            return
        except OSError:  # another filesystem (EXDEV), links not allowed, a name already there: copy instead
            (target / path.name).unlink(missing_ok=True)
    client.log_model_artifact(model_id, str(path))


def _local_folder(uri: str) -> Path | None:
    """The folder a `file:` (or plain path) artifact location names; None for a remote store."""
    from urllib.parse import unquote, urlparse  # noqa: PLC0415

    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


@dataclass(frozen=True)
class LoggedModelRef:
    model_uri: str
    model_id: str | None
    # Files the LoggedModel holds byte for byte as the package's model folder has them (by name).
    verbatim: tuple[str, ...] = ()


def _schema(tensors: Sequence[TensorInfo]) -> Schema:
    import numpy as np  # noqa: PLC0415 - only registering a version needs it

    return Schema([TensorSpec(np.dtype(t.dtype), t.shape, t.name) for t in tensors])


def _owner_tags() -> dict[str, str]:
    pid = os.getpid()
    return {T.PID: str(pid), T.HOST: socket.gethostname(), T.PROC_START: f"{psutil.Process(pid).create_time():.3f}"}


@contextmanager
def release_run(experiment_id: str, run_name: str, tags: dict[str, str]) -> Iterator[ReleaseRun]:
    """Start a release run owned by this process; it ends FINISHED, KILLED on Ctrl-C or SIGTERM, else FAILED."""
    with _writing("start"):
        run = mlflow.start_run(experiment_id=experiment_id, run_name=run_name)
    status = "FINISHED"
    try:
        with _writing("set the owner tags"):
            mlflow.set_tags({**tags, **_owner_tags()})
        yield ReleaseRun(run.info.run_id)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        try:
            with _writing("end"):
                mlflow.end_run(status)
        except RegistryError:
            # With an error on its way out, it says what went wrong; raised from this `finally`, a failure
            # to end the run (the same dead server, usually) would replace it. The next command reaps it.
            if status == "FINISHED":
                raise


def _owner_alive(tags: dict[str, str]) -> bool | None:
    """True/False for a run owned by a process on this host; None when it ran elsewhere (cannot tell)."""
    if tags.get(T.HOST) != socket.gethostname() or T.PID not in tags:
        return None
    try:
        proc = psutil.Process(int(tags[T.PID]))
        started: float = proc.create_time()
        return abs(started - float(tags.get(T.PROC_START, "0"))) < 1.0
    except (psutil.NoSuchProcess, ValueError):
        return False


def in_flight(client: MlflowClient, run_id: str) -> bool:
    """A release run still RUNNING under a relctl process that is alive on this host (elsewhere: unknown, False)."""
    run = client.get_run(run_id)
    return run.info.status == "RUNNING" and _owner_alive(run.data.tags) is True


def reap_dead_runs(client: MlflowClient, experiment_id: str, model: str) -> list[str]:
    """Mark KILLED every RUNNING release run of `model` whose relctl process is gone; one note per run."""
    query = f"tags.{filters.identifier(T.MODEL)} = {filters.literal(model)} and attributes.status = 'RUNNING'"
    runs = client.search_runs([experiment_id], filter_string=query, max_results=100)
    notes = []
    active = mlflow.active_run()
    for run in runs:
        if active is not None and run.info.run_id == active.info.run_id:
            continue
        if _owner_alive(run.data.tags) is not False:
            continue
        when = datetime.now(UTC).isoformat(timespec="seconds")
        note = (f"The relctl process that ran this release (pid {run.data.tags.get(T.PID)} on "
                f"{run.data.tags.get(T.HOST)}) died before it finished; marked KILLED at {when}. "
                "Nothing it had not recorded here was registered.")
        report = {"outcome": "killed", "release_run": run.info.run_id, "model": model, "note": note}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.json"
            path.write_text(json.dumps(report, indent=2))
            client.log_artifact(run.info.run_id, str(path), "report")
        client.set_tag(run.info.run_id, T.OUTCOME, "killed")
        client.set_tag(run.info.run_id, T.NOTE, note)
        client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))
        notes.append(f"release run {run.info.run_id} of '{model}' was left running by a dead process; marked KILLED")
    return notes
