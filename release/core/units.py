"""Sizes as people read them: the unit that shows the figure (a 9 MB model is "8.6 MiB", not "0.00 GiB")."""

from __future__ import annotations

UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size(n_bytes: float, width: int = 0) -> str:
    """`n_bytes` in the largest binary unit it is at least one of, with two decimals (bytes below 1 KiB).

    `width` right-aligns the number, so a column of sizes in mixed units still lines up."""
    for unit, factor in UNITS:
        if abs(n_bytes) >= factor:
            return f"{n_bytes / factor:{width}.2f} {unit}"
    return f"{n_bytes:{width}.0f} B"
