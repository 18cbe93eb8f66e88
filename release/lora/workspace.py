"""Buffers reused from one tensor to the next.

A fresh multi-megabyte allocation is returned to the OS when freed, so the next one pays a page fault
per 4 KiB on first touch; on a VM that costs more than the arithmetic. Reusing a few buffers sized for
the largest tensor seen keeps the merge fast and its memory flat: it grows with the largest tensor the
adapter changes, never with the model.
"""

from __future__ import annotations

from math import prod

import torch


class Workspace:
    """Named, growable scratch buffers; a view taken from a slot is valid until that slot is taken again."""

    def __init__(self) -> None:
        self._slots: dict[str, torch.Tensor] = {}

    def take(self, slot: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of `shape` and `dtype` backed by the slot's buffer."""
        nbytes = prod(shape) * dtype.itemsize
        buffer = self._slots.get(slot)
        if buffer is None or buffer.numel() < nbytes:
            self._slots.pop(slot, None)  # free the old buffer before allocating the bigger one
            buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            self._slots[slot] = buffer
        return buffer[:nbytes].view(dtype).view(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self._slots.values())
