"""Weights that cannot serve: NaN or Inf anywhere, or values the target precision cannot hold.

Read tensor by tensor (and in chunks within a tensor) straight from the safetensors byte ranges, so
memory stays flat with model size and no framework is needed (bf16 is widened to fp32 by a bit shift);
the same read hashes each file, so intake reads the weights once.
A NaN is refused at intake, naming the tensor, instead of surfacing 35 s later as "top-1 agreement 0".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from release.core.checkpoint import read_header
from release.core.errors import InputError
from release.core.hashing import file_stamp, remember

FP16_MAX = 65504.0
CHUNK_ELEMENTS = 8 * 1024 * 1024
FLOAT_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BF16": np.uint16}


def _widen(raw: bytes, dtype: str) -> np.ndarray:
    values = np.frombuffer(raw, dtype=np.dtype(FLOAT_DTYPES[dtype]).newbyteorder("<"))
    if dtype == "BF16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values


def scan_weights(files: list[Path]) -> dict[str, float]:
    """max |x| of every floating tensor, by name, and each file's sha256 (remembered by release.core.hashing,
    so lineage and the stage manifest do not read the file again), in one sequential read of each file;
    InputError naming the first tensor with NaN or Inf."""
    out: dict[str, float] = {}
    for path in files:
        header = read_header(path)
        stamp = file_stamp(path)
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            # The header, then the tensors in file order: they tile the data section exactly (read_header
            # checked it), so the digest covers every byte once.
            digest.update(fh.read(min((i.start for i in header.tensors.values()), default=path.stat().st_size)))
            for info in sorted(header.tensors.values(), key=lambda i: i.start):
                floating = info.dtype in FLOAT_DTYPES
                step = CHUNK_ELEMENTS * (np.dtype(FLOAT_DTYPES[info.dtype]).itemsize if floating else 1)
                left, peak = info.nbytes, 0.0
                while left > 0:
                    raw = fh.read(min(step, left))
                    if not raw:
                        raise InputError(f"{path.name}: ends inside tensor '{info.name}'",
                                         hint="the file was truncated; fetch the checkpoint again")
                    left -= len(raw)
                    digest.update(raw)
                    if not floating:
                        continue
                    chunk = _widen(raw, info.dtype)
                    if not np.isfinite(chunk).all():
                        bad = "NaN" if np.isnan(chunk).any() else "Inf"
                        raise InputError(f"{path.name}: tensor '{info.name}' contains {bad}",
                                         hint="the training run diverged or the checkpoint is corrupt; "
                                              "promote an earlier checkpoint")
                    if chunk.size:
                        peak = max(peak, float(np.abs(chunk.astype(np.float64)).max()))
                if floating and info.nbytes:
                    out[info.name] = peak
            digest.update(fh.read())  # nothing, for a file read_header accepted
        remember(path, stamp, digest.hexdigest())
    return out


def tensor_max_abs(files: list[Path]) -> dict[str, float]:
    """max |x| of every floating tensor, by name; InputError naming the first tensor with NaN or Inf."""
    return scan_weights(files)


def fp16_overflows(max_abs: dict[str, float]) -> list[str]:
    """Tensors with a value above fp16's largest finite value (65504): they become Inf at fp16."""
    return sorted(name for name, peak in max_abs.items() if peak > FP16_MAX)
