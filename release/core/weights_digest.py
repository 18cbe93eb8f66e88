"""The base digest: one sha256 that names a set of base weights by content, the identity an adapter is
checked against (names are not evidence: transformers 5 writes no base name into an adapter).

It is the sha256 of the sorted `name<TAB>sha256` lines of the weight files (safetensors) of a checkpoint,
the figures intake already records (`lineage.weights.<file>.sha256`), so a release pays nothing extra. The
file names are part of it: the same tensors resharded are a different base, and an adapter is refused
rather than served on weights nobody proved equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from release.core.checkpoint import weight_files
from release.core.hashing import sha256_file


def base_digest(weights_sha256: Mapping[str, str]) -> str:
    """The base digest of weight files given as {file name: sha256}; 'sha256:<hex>'."""
    lines = "".join(f"{name}\t{digest}\n" for name, digest in sorted(weights_sha256.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def folder_base_digest(folder: Path | str) -> str:
    """The base digest of the base weights in a Hugging Face checkpoint folder (adapter files excluded);
    `relctl digest DIR` prints it."""
    return base_digest({p.name: sha256_file(p) for p in weight_files(Path(folder))})


def adapter_digest(adapter_sha256: Mapping[str, str]) -> str:
    """One digest for an adapter's files ({name: sha256}), the same construction as the base digest."""
    return base_digest(adapter_sha256)
