"""Weights that cannot serve: NaN or Inf anywhere, or values the target precision cannot hold.

Read tensor by tensor (and in chunks within a tensor) straight from the safetensors byte ranges, so
memory stays flat with model size and no framework is needed; the same read hashes each file, so intake
reads the weights once. The values are never converted: with the sign bit cleared, an IEEE float's bits
order like its magnitude as an unsigned integer, every bit pattern at or above the exponent-all-ones
one is Inf (equal) or NaN (above), so one mask, one max and one compare per chunk give max |x| and
finiteness exactly (a Qwen2.5-1.5B-shaped bf16 checkpoint, 3.09 GB: intake 18.8 s before, against a
3.1 s read; see benchmarks/results/scaling.json).
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
# dtype -> (the unsigned integer of its width, the float to read a bit pattern back as, Inf's bits).
# bf16's bits are fp32's upper half: read back by a 16-bit shift.
FLOAT_BITS: dict[str, tuple[type[np.unsignedinteger], type[np.floating] | None, int]] = {
    "F16": (np.uint16, np.float16, 0x7C00),
    "BF16": (np.uint16, None, 0x7F80),
    "F32": (np.uint32, np.float32, 0x7F800000),
    "F64": (np.uint64, np.float64, 0x7FF0000000000000),
}


def _magnitudes(raw: bytes, dtype: str) -> tuple[np.ndarray, int]:
    """The bit patterns of `raw` with the sign cleared, and Inf's pattern."""
    uint, _, inf = FLOAT_BITS[dtype]
    bits = np.frombuffer(raw, dtype=np.dtype(uint).newbyteorder("<"))
    width = bits.dtype.itemsize * 8
    return bits & np.array((1 << (width - 1)) - 1, dtype=bits.dtype), inf


def _as_float(pattern: int, dtype: str) -> float:
    uint, floating, _ = FLOAT_BITS[dtype]
    if floating is None:  # bf16
        return float(np.array(pattern << 16, dtype=np.uint32).view(np.float32))
    return float(np.array(pattern, dtype=uint).view(floating))


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
                floating = info.dtype in FLOAT_BITS
                step = CHUNK_ELEMENTS * (np.dtype(FLOAT_BITS[info.dtype][0]).itemsize if floating else 1)
                left, peak = info.nbytes, 0
                while left > 0:
                    raw = fh.read(min(step, left))
                    if not raw:
                        raise InputError(f"{path.name}: ends inside tensor '{info.name}'",
                                         hint="the file was truncated; fetch the checkpoint again")
                    left -= len(raw)
                    digest.update(raw)
                    if not floating:
                        continue
                    magnitudes, inf = _magnitudes(raw, info.dtype)
                    top = int(magnitudes.max()) if magnitudes.size else 0
                    if top >= inf:
                        bad = "NaN" if top > inf else "Inf"
                        raise InputError(f"{path.name}: tensor '{info.name}' contains {bad}",
                                         hint="the training run diverged or the checkpoint is corrupt; "
                                              "promote an earlier checkpoint")
                    peak = max(peak, top)
                if floating and info.nbytes:
                    out[info.name] = _as_float(peak, info.dtype)
            digest.update(fh.read())  # nothing, for a file read_header accepted
        remember(path, stamp, digest.hexdigest())
    return out


def tensor_max_abs(files: list[Path]) -> dict[str, float]:
    """max |x| of every floating tensor, by name; InputError naming the first tensor with NaN or Inf."""
    return scan_weights(files)


def fp16_overflows(max_abs: dict[str, float]) -> list[str]:
    """Tensors with a value above fp16's largest finite value (65504): they become Inf at fp16."""
    return sorted(name for name, peak in max_abs.items() if peak > FP16_MAX)
