"""The fp32 reference a release built, as the gates and the precision search open it (GateContext.load_reference):
the folder it loads from, how to load it, and the release's cache of what was computed on it.

What a gate computes on the reference (the eval set's rows scored by it) depends on the reference's content
and the gate's inputs only, so it is kept under a key made of the reference's content digest, a name and the
settings that shaped it (`computed`): `precision: auto`'s paired eval and the final eval gate score the
reference once per release, and a resumed promote reuses what the first attempt scored. Each scoring and each
reuse is recorded in the cache's log (`usage`: the report's count of reference scorings).

Calling the object loads the reference, so it is still the plain `Callable[[], LoadedModel]` of the contract.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from release.backends.base import LoadedModel
from release.core.hashing import file_stamp, remember, sha256_file, sha256_json

CACHE_DIR = "reference-cache"     # beside a release's stage folders (promote's work folder)
USES_FILE = "uses.jsonl"


def cache_dir_of(work_dir: Path) -> Path:
    """Where a release whose stage folders are in `work_dir` keeps what was computed on its reference."""
    return work_dir / CACHE_DIR


def folder_digest(folder: Path) -> str:
    """sha256 over every file of `folder` (relative name and content): weights, config and tokenizer alike.
    Each file's digest is remembered by its change stamps, so digesting the same folder again costs a stat."""
    lines = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stamp = file_stamp(path)
        digest = sha256_file(path)
        remember(path, stamp, digest)
        lines.append(f"{path.relative_to(folder).as_posix()}\t{digest}\n")
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


@dataclass(frozen=True)
class ReferenceModel:
    """The reference at `folder`, opened by `loader`; `cache_dir` None: nothing is kept (`relctl gate`)."""

    folder: Path
    loader: Callable[[Path], LoadedModel]
    cache_dir: Path | None = None

    def __call__(self) -> LoadedModel:
        return self.loader(self.folder)

    @cached_property
    def digest(self) -> str:
        return folder_digest(self.folder)

    def computed(self, what: str, settings: dict[str, Any], compute: Callable[[LoadedModel], Any],
                 by: str) -> tuple[Any, bool]:
        """(value, reused): `compute(reference)`'s JSON value for `what` under `settings`, computed once per
        reference content and settings and kept in the cache (written whole, then renamed into place)."""
        if self.cache_dir is None:
            return compute(self()), False
        key = sha256_json({"reference": self.digest, "what": what, "settings": settings})
        entry = self.cache_dir / f"{what}-{key[:32]}.json"
        if entry.is_file():
            value = json.loads(entry.read_text())["value"]
            self._log({"what": what, "key": key, "by": by, "scored": False})
            return value, True
        started = time.perf_counter()
        value = compute(self())
        seconds = time.perf_counter() - started
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        partial = entry.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps({"reference": self.digest, "what": what, "settings": settings,
                                       "seconds": round(seconds, 3), "value": value}))
        partial.replace(entry)
        self._log({"what": what, "key": key, "by": by, "scored": True, "seconds": round(seconds, 3)})
        return value, False

    def _log(self, use: dict[str, Any]) -> None:
        assert self.cache_dir is not None
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with (self.cache_dir / USES_FILE).open("a") as fh:
            fh.write(json.dumps({**use, "folder": str(self.folder)}) + "\n")


def usage(cache_dir: Path) -> dict[str, Any] | None:
    """The release's reference scorings and reuses, from the cache's log (None when nothing used it):
    `scorings` (each computation on the reference), `reused`, the seconds the scorings took, and who."""
    log = cache_dir / USES_FILE
    if not log.is_file():
        return None
    uses = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    scored = [u for u in uses if u.get("scored")]
    return {"scorings": len(scored), "reused": len(uses) - len(scored),
            "seconds": round(sum(float(u.get("seconds") or 0.0) for u in scored), 3),
            "uses": [{"by": u.get("by"), "what": u.get("what"), "scored": bool(u.get("scored")),
                      **({"seconds": u["seconds"]} if "seconds" in u else {})} for u in uses]}
