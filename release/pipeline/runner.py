"""Runs stages with resume: each finished stage leaves its outputs and a manifest.

A stage's folder is `<work>/<label>-<fingerprint[:12]>/`, so two promotes of the same run with different
inputs (say int4 and int8) never share a folder, and the same inputs find the same finished work. A
stage is finished when its manifest exists, its fingerprint matches, and the files it recorded still
have their checksums (re-verified on resume). Outputs are built in `<folder>.partial/` and renamed when
complete, so an interrupted stage leaves nothing that looks finished; a file lock per folder makes a
second promote wait for the first instead of writing the same folder. Around all of that, `promote_lock`
keeps one promote of a run in flight (a CI retry, a webhook redelivery): the gates' folders under
`<work>/gates/` and the registering version are never shared by two at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from release.core.errors import InputError, RegistryError
from release.core.faults import pause_point
from release.core.hashing import sha256_tree
from release.core.jsonfile import load_json_object
from release.core.progress import Progress
from release.registry.store import STATE_DIR
from release.stages.base import Stage, StageResult

MANIFEST = "manifest.json"
DEFAULT_PROMOTE_WAIT_S = 1800.0
ResultT = TypeVar("ResultT", bound=StageResult)


@dataclass(frozen=True)
class Done(Generic[ResultT]):
    name: str
    dir: Path
    result: ResultT
    seconds: float
    resumed: bool
    fingerprint: str

    def path(self, relative: str) -> Path:
        """A path from the result (relative to the stage folder) as a real path."""
        return self.dir / relative


@contextmanager
def folder_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def promote_wait_s() -> float:
    """How long a promote waits for another promote of the same run (`RELCTL_PROMOTE_WAIT_S`, default 1800 s)."""
    return float(os.environ.get("RELCTL_PROMOTE_WAIT_S", DEFAULT_PROMOTE_WAIT_S))


def _promote_lock_path(key: str, fallback: Path) -> Path:
    # Machine-wide (not per project folder), so two checkouts of one CI runner promoting the same run into
    # the same registry are serialized too; a private /tmp falls back to the project's own folder.
    shared = Path(tempfile.gettempdir()) / "relctl-locks"
    try:
        shared.mkdir(exist_ok=True)
        if shared.stat().st_uid == os.getuid():
            shared.chmod(0o1777)  # every user's relctl may take a lock here, none may remove another's
        path = shared / f"promote-{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"
        path.open("a").close()
        return path
    except OSError:
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback / "promote.lock"


@contextmanager
def promote_lock(key: str, label: str, fallback: Path, progress: Progress) -> Iterator[None]:
    """One promote of a run in flight at a time: a second one waits (saying so) and then goes on from the
    first's finished stages and registry state; past the deadline it stops with exit 4 naming the holder."""
    path = _promote_lock_path(key, fallback)
    with path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            wait = promote_wait_s()
            holder = path.read_text().strip() or "another relctl"
            progress.note(f"another promote of {label} is in flight ({holder}); waiting for it to finish "
                          f"(up to {wait:g} s, RELCTL_PROMOTE_WAIT_S)")
            deadline = time.monotonic() + wait
            while True:
                time.sleep(0.2)
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RegistryError(f"another promote of {label} is still in flight ({holder}) after "
                                            f"{wait:g} s", hint="let it finish, then re-run this promote (it "
                                            "resumes); RELCTL_PROMOTE_WAIT_S sets the wait") from None
            progress.note(f"the other promote of {label} is done; going on from what it finished")
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{datetime.now(UTC).isoformat(timespec='seconds')}")
            fh.flush()
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)


class Pipeline:
    def __init__(self, work_dir: Path, progress: Progress) -> None:
        self.work_dir = work_dir
        self.progress = progress
        self.done: dict[str, Done[Any]] = {}

    def run(self, stage: Stage[Any, ResultT]) -> Done[ResultT]:
        """Run `stage` unless a finished, intact folder with the same fingerprint exists."""
        fingerprint = stage.inputs.fingerprint()
        if not stage.resumable:
            # Its state lives elsewhere (the registry): a scratch folder, nothing left behind to resume.
            with tempfile.TemporaryDirectory(prefix=f"relctl-{stage.label}-") as tmp:
                scratch = self._execute_in(stage, Path(tmp), fingerprint)
            self.done[stage.label] = scratch
            return scratch
        final = self.work_dir / f"{stage.label}-{fingerprint[:12]}"
        with folder_lock(final.with_name(final.name + ".lock")):
            done = self._resume(stage, final, fingerprint)
            if done is None:
                done = self._execute(stage, final, fingerprint)
        self.done[stage.label] = done
        pause_point(f"stage-done:{stage.label}")
        return done

    def _resume(self, stage: Stage[Any, ResultT], final: Path, fingerprint: str) -> Done[ResultT] | None:
        manifest = final / MANIFEST
        if not manifest.is_file():
            return None
        recorded = load_json_object(manifest, hint=f"remove {final} to rebuild that stage",
                                    label=f"{final.name}/{MANIFEST}")
        if recorded.get("fingerprint") != fingerprint:
            return None
        if sha256_tree(final, exclude=frozenset({MANIFEST})) != recorded.get("files"):
            self.progress.note(f"{stage.label}: finished output changed on disk since it was written; rebuilding")
            return None
        result = stage.load_result(recorded["result"])
        self.progress.done(stage.label, 0.0, stage.summary(result), skipped=True)
        return Done(stage.label, final, result, float(recorded["seconds"]), True, fingerprint)

    def _execute_in(self, stage: Stage[Any, ResultT], out: Path, fingerprint: str) -> Done[ResultT]:
        start = time.perf_counter()
        try:
            with self.progress.stage(stage.label):
                result = stage.run(out)
        except InputError:
            raise
        except BaseException:
            self.progress.failed(stage.label, "failed")
            raise
        seconds = time.perf_counter() - start
        self.progress.done(stage.label, seconds, stage.summary(result))
        return Done(stage.label, out, result, seconds, False, fingerprint)

    def _sweep_abandoned(self, label: str, keep: Path) -> None:
        """Half-built folders of this stage that no live process holds (a killed run's) are removed."""
        for partial in self.work_dir.glob(f"{label}-*.partial"):
            if partial == keep:
                continue
            lock = partial.with_name(partial.name.removesuffix(".partial") + ".lock")
            with lock.open("a") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another promote is building it right now
                shutil.rmtree(partial, ignore_errors=True)
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _execute(self, stage: Stage[Any, ResultT], final: Path, fingerprint: str) -> Done[ResultT]:
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self._sweep_abandoned(stage.label, partial)
        partial.mkdir(parents=True)
        start = time.perf_counter()
        try:
            with self.progress.stage(stage.label):
                result = stage.run(partial)
        except InputError:
            raise  # bad input is reported as its own single error line
        except BaseException:
            self.progress.failed(stage.label, "failed")
            raise
        seconds = time.perf_counter() - start
        files = sha256_tree(partial)
        (partial / MANIFEST).write_text(json.dumps(
            {"stage": stage.name, "label": stage.label, "fingerprint": fingerprint,
             "inputs": stage.inputs.model_dump(mode="json"), "result": result.model_dump(mode="json"),
             "files": files, "seconds": seconds}, indent=2, default=str))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        self.progress.done(stage.label, seconds, stage.summary(result))
        return Done(stage.label, final, result, seconds, False, fingerprint)


def work_dir_for(project_dir: Path, run_id: str) -> Path:
    """Where a promote of `run_id` keeps its stage folders (each keyed by its own inputs' fingerprint)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)
    return (project_dir / STATE_DIR / "work" / safe).resolve()


def run_standalone(stage: Stage[Any, ResultT], out: Path) -> ResultT:
    """Run `stage` into `out` once, without manifests: what each `relctl <stage>` subcommand does."""
    out.mkdir(parents=True, exist_ok=True)
    return stage.run(out)
