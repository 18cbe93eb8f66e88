"""Where a command writes: checked before any work starts, written atomically, nothing a user owns deleted.

A command that writes a folder (convert, merge, package, intake, pull) writes a new one, or replaces one
it recognisably wrote itself (`reusable`), and refuses a non-empty folder it did not make; the folder is
built beside its destination under a fresh temporary name and renamed into place, so it appears whole or
not at all. A command that writes a file (render -o) checks its folder exists and is writable first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from release.core.errors import InputError


def _existing_ancestor(path: Path, option: str) -> Path:
    """The nearest existing ancestor of `path`: a writable folder, or InputError naming what is in the way."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{option} {path}: {parent} is a file, not a folder",
                                 hint="choose a path under a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise InputError(f"{option} {path}: {parent} is not writable", hint="choose a folder you can write to")
            return parent
    raise InputError(f"{option} {path}: no existing folder above it", hint="choose a path under a folder")


def check_output_file(path: Path, option: str) -> Path:
    """`path` as a file to write: its folder exists and is writable, and it is not itself a folder."""
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder", hint="pass a file name")
    if not path.absolute().parent.is_dir():
        raise InputError(f"{option} {path}: the folder {path.absolute().parent} does not exist",
                         hint="create it first, or choose a path in an existing folder")
    _existing_ancestor(path, option)
    return path


def check_new_folder(path: Path, option: str, reusable: Callable[[Path], bool] | None = None) -> Path:
    """`path` as a folder to write: absent, empty, or one `reusable` recognises as this command's own output;
    InputError (before any work) for a file, a non-empty folder it did not make, or a path it cannot create."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path}: is a file, not a folder", hint="pass a new folder")
    _existing_ancestor(path, option)
    if path.is_dir() and any(path.iterdir()) and not (reusable is not None and reusable(path)):
        raise InputError(f"{option} {path}: the folder is not empty and relctl did not write it",
                         hint="pass a new (or empty) folder; nothing in that one is touched")
    return path


@contextlib.contextmanager
def staging_folder(out: Path) -> Iterator[Path]:
    """A fresh temporary folder beside `out` (never an existing name), removed unless it was moved away."""
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.absolute().parent))
    try:
        yield partial
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def replace_folder(built: Path, out: Path) -> None:
    """Move `built` to `out` (an absent, empty, or already-checked reusable folder), whole or not at all:
    the old one is moved aside first and removed only once the new one is in place."""
    out = out.absolute()
    if not out.exists():
        built.rename(out)
        return
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
        built.rename(out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    aside.rmdir()
    out.rename(aside)
    try:
        built.rename(out)
    except OSError:
        aside.rename(out)
        raise
    shutil.rmtree(aside, ignore_errors=True)
