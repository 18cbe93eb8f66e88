"""Disk kept by promotes' work folders (`.relctl/work/<run>/<stage>-<fingerprint>/`): pruned after a
release, and `relctl gc` for the rest.

After a successful release (a version registered) the registry holds the package, and the training run
holds the checkpoint, so `prune_released` removes the two checkpoint copies the work folder made: intake's
fetched checkpoint and merge's merged one (the largest items: 2x the checkpoint). What a re-run needs to
resume stays: reference, convert, validate, memory and package keep their folders, and their fingerprints
chain on their inputs' fingerprints, not on files, so a re-run fetches and merges again (seconds to
minutes) and resumes everything after.

`relctl gc` (plan_gc / collect) goes further: the whole work folder of every run whose release finished,
and, with --all, of unfinished runs too (their resume is then lost: a re-run starts over). It never touches
the folder of a promote in flight: it takes that run's promote lock without waiting (release/pipeline/
runner.py promote_lock, the same machine-wide lock a second promote of the run waits on) and holds it while
it deletes, so no promote can start on a folder being removed.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from release.pipeline.runner import _promote_lock_path
from release.registry import filters
from release.registry import tags as T
from release.registry.states import APPROVED, AWAITING_APPROVAL, REGISTERED, REJECTED, RELEASED

if TYPE_CHECKING:
    from release.registry import Registry

PRUNED_AFTER_RELEASE = ("intake", "merge")
# A version in one of these states has its package in the registry: its release needs no work folder.
FINISHED_STATES = frozenset({RELEASED, REGISTERED, REJECTED, AWAITING_APPROVAL, APPROVED})


def folder_bytes(path: Path) -> int:
    """Bytes in `path`, hard links counted once (package/ links convert's model files)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if item.is_file() and not item.is_symlink():
            st = item.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def prune_released(work_dir: Path) -> int:
    """Remove the checkpoint copies of a released run's work folder (see the module docstring); the bytes
    freed. Called under the run's promote lock, by the promote that released."""
    freed = 0
    for stage in PRUNED_AFTER_RELEASE:
        for folder in work_dir.glob(f"{stage}-*"):
            if folder.is_dir():
                freed += folder_bytes(folder)
                shutil.rmtree(folder, ignore_errors=True)
    return freed


@dataclass(frozen=True)
class WorkFolder:
    run_id: str
    path: Path
    bytes: int
    finished: bool       # a version of this run is in the registry
    in_flight: bool      # a promote of this run holds its lock now
    linked: bool = False  # a symlink: what it points at is not relctl's to delete (rmtree refuses it too)

    def removable(self, include_unfinished: bool) -> bool:
        """Whether gc deletes this folder: never in flight, never a symlink, unfinished only with --all."""
        return not self.in_flight and not self.linked and (self.finished or include_unfinished)

    @property
    def action(self) -> str:
        if self.linked:
            return "kept: a symlink (gc deletes only folders relctl made; remove the link yourself)"
        if self.in_flight:
            return "kept: a promote of this run is in flight"
        if self.finished:
            return "removed: its release finished (the registry holds the package)"
        return "kept unless --all: an unfinished release resumes from it"


@contextmanager
def run_lock(tracking_uri: str, run_id: str, fallback: Path) -> Iterator[bool]:
    """The run's promote lock taken without waiting: yields False when a promote holds it."""
    path = _promote_lock_path(f"{tracking_uri}|{run_id}", fallback)
    with path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def finished_runs(registry: Registry) -> set[str]:
    """Training runs with a registered version (any model) in a state past registering."""
    runs: set[str] = set()
    for name in registry.list_models():
        for mv in registry.client.search_model_versions(f"name = {filters.literal(name)}"):
            tags = dict(mv.tags or {})
            run = tags.get(T.TRAINING_RUN)
            if run and tags.get(T.RELEASE_STATE) in FINISHED_STATES:
                runs.add(run)
    return runs


def plan_gc(work_root: Path, tracking_uri: str, finished: set[str], fallback: Path) -> list[WorkFolder]:
    folders = []
    for path in sorted(p for p in work_root.iterdir() if p.is_dir()) if work_root.is_dir() else []:
        with run_lock(tracking_uri, path.name, fallback) as free:
            linked = path.is_symlink()
            folders.append(WorkFolder(path.name, path, 0 if linked else folder_bytes(path), path.name in finished,
                                      not free, linked))
    return folders


def collect(folder: WorkFolder, tracking_uri: str, fallback: Path, include_unfinished: bool) -> bool:
    """Remove `folder` when its plan says so; re-checks the lock and holds it while deleting. True only when
    the folder is gone: rmtree's ignored errors (a symlink, a read-only file) must not read as "removed"."""
    if not folder.removable(include_unfinished) or folder.path.is_symlink():
        return False
    with run_lock(tracking_uri, folder.run_id, fallback) as free:
        if not free:
            return False
        shutil.rmtree(folder.path, ignore_errors=True)
    return not folder.path.exists()
