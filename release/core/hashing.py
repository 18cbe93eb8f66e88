"""Content hashes: every file, folder and config relctl records is identified by sha256 of its bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK = 4 * 1024 * 1024

# Digests computed while a file was read for another purpose (intake's NaN scan hashes each weight file in
# the same pass), keyed by the file's identity and change stamps: a later sha256_file of the unchanged file
# (lineage, the stage manifest) costs a stat, not another read of gigabytes. Any write changes st_ctime_ns
# (which no user call can set back), so a changed file is always read again.
_known: dict[tuple[int, int, int, int, int], str] = {}


def _stamp(path: Path) -> tuple[int, int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember(path: Path, stamp: tuple[int, int, int, int, int], digest: str) -> None:
    """Record `digest` as the sha256 of `path` as it was at `stamp` (taken before the read that hashed it)."""
    if _stamp(path) == stamp:
        _known[stamp] = digest


def file_stamp(path: Path) -> tuple[int, int, int, int, int]:
    return _stamp(path)


def sha256_file(path: Path) -> str:
    known = _known.get(_stamp(path))
    if known is not None:
        return known
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_json(data: Any) -> str:
    """Hash of canonical JSON (sorted keys, no whitespace), so equal configs hash equal."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_tree(root: Path, exclude: frozenset[str] = frozenset()) -> dict[str, str]:
    """sha256 of every file below `root`, keyed by POSIX relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() not in exclude
    }
