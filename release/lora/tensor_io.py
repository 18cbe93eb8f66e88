"""Byte-range I/O on safetensors files: one tensor in, one tensor out, everything else copied by the kernel.

Nothing is memory-mapped: mapped pages count towards the process's resident set, and reading a large
checkpoint through a map would grow it with the model. Tensors that change are read with pread into
their own buffer; the bytes in between go file to file with copy_file_range and never enter Python.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

import torch

from release.core.checkpoint import TensorInfo
from release.lora.workspace import Workspace

TORCH_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
CHUNK = 64 * 1024 * 1024
# copy_file_range is missing or refused across some filesystems and kernels; fall back to pread/pwrite.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}
Progress = Callable[[int], None]

if sys.byteorder != "little":  # safetensors is little-endian and the buffers below are used as-is
    raise ImportError("relctl's merge needs a little-endian machine")


def read_tensor(fd: int, info: TensorInfo, workspace: Workspace | None = None, slot: str = "base") -> torch.Tensor:
    """The tensor at `info`'s byte range, writable so folds can work in place.

    With a workspace it lives in the workspace's `slot` (valid until that slot is taken again).
    """
    dtype = TORCH_DTYPES[info.dtype]
    if workspace is not None:
        tensor = workspace.take(slot, info.shape, dtype)
    else:
        tensor = torch.empty(info.shape, dtype=dtype)
    if info.nbytes:
        _pread_exact(fd, tensor.reshape(-1).view(torch.uint8).numpy().data, info.start)
    return tensor


def write_tensor(fd: int, tensor: torch.Tensor, info: TensorInfo) -> int:
    """Write `tensor` (row-major, in `info`'s dtype) at `info`'s byte range; return the bytes written."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8)
    if data.numel() != info.nbytes or tensor.dtype != TORCH_DTYPES[info.dtype]:
        raise RuntimeError(f"bug: merged '{info.name}' is {tensor.dtype}{list(tensor.shape)}, expected {info.dtype}")
    _pwrite_all(fd, data.numpy().data, info.start)
    return info.nbytes


def copy_range(src: int, dst: int, start: int, end: int, progress: Progress) -> None:
    """Copy bytes [start, end) from `src` to the same offsets in `dst`."""
    offset = start
    while offset < end:
        count = min(CHUNK, end - offset)
        try:
            done = os.copy_file_range(src, dst, count, offset, offset)
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise
            done = _copy_in_user_space(src, dst, offset, count)
        if done == 0:
            raise OSError(errno.EIO, f"source ended at byte {offset}, expected {end} bytes")
        offset += done
        progress(done)


def _copy_in_user_space(src: int, dst: int, offset: int, count: int) -> int:
    buffer = bytearray(count)
    view = memoryview(buffer)
    _pread_exact(src, view, offset)
    _pwrite_all(dst, view, offset)
    return count


def _pread_exact(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(errno.EIO, f"file ended at byte {offset + done} while reading {len(view)} bytes")
        done += n


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwritev(fd, [view[done:]], offset + done)
