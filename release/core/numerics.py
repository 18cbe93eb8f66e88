"""Weights that cannot serve: NaN or Inf anywhere, or values the target precision cannot hold.

Read tensor by tensor (and in chunks within a tensor) straight from the safetensors byte ranges, so
memory stays flat with model size and no framework is needed (bf16 is widened to fp32 by a bit shift).
A NaN is refused at intake, naming the tensor, instead of surfacing 35 s later as "top-1 agreement 0".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from release.core.checkpoint import TensorInfo, read_header
from release.core.errors import InputError

FP16_MAX = 65504.0
CHUNK_ELEMENTS = 8 * 1024 * 1024
FLOAT_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BF16": np.uint16}


def _chunks(path: Path, info: TensorInfo) -> Iterator[np.ndarray]:
    raw_dtype = np.dtype(FLOAT_DTYPES[info.dtype]).newbyteorder("<")
    count = info.nbytes // raw_dtype.itemsize
    with path.open("rb") as fh:
        fh.seek(info.start)
        done = 0
        while done < count:
            n = min(CHUNK_ELEMENTS, count - done)
            values = np.frombuffer(fh.read(n * raw_dtype.itemsize), dtype=raw_dtype)
            done += n
            if info.dtype == "BF16":
                values = (values.astype(np.uint32) << 16).view(np.float32)
            yield values


def tensor_max_abs(files: list[Path]) -> dict[str, float]:
    """max |x| of every floating tensor, by name; InputError naming the first tensor with NaN or Inf."""
    out: dict[str, float] = {}
    for path in files:
        for name, info in read_header(path).tensors.items():
            if info.dtype not in FLOAT_DTYPES or info.nbytes == 0:
                continue
            peak = 0.0
            for chunk in _chunks(path, info):
                if not np.isfinite(chunk).all():
                    bad = "NaN" if np.isnan(chunk).any() else "Inf"
                    raise InputError(f"{path.name}: tensor '{name}' contains {bad}",
                                     hint="the training run diverged or the checkpoint is corrupt; "
                                          "promote an earlier checkpoint")
                peak = max(peak, float(np.abs(chunk.astype(np.float64)).max()))
            out[name] = peak
    return out


def fp16_overflows(max_abs: dict[str, float]) -> list[str]:
    """Tensors with a value above fp16's largest finite value (65504): they become Inf at fp16."""
    return sorted(name for name, peak in max_abs.items() if peak > FP16_MAX)
