"""Sizes and figures as people read them: the unit that shows the figure (a 9 MB model is "8.6 MiB", not
"0.00 GiB"), thousands separated, a few significant digits."""

from __future__ import annotations

UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size(n_bytes: float, width: int = 0) -> str:
    """`n_bytes` in the largest binary unit it is at least one of, with two decimals (bytes below 1 KiB).

    `width` right-aligns the number, so a column of sizes in mixed units still lines up."""
    for unit, factor in UNITS:
        if abs(n_bytes) >= factor:
            return f"{n_bytes / factor:{width}.2f} {unit}"
    return f"{n_bytes:{width}.0f} B"


def figure(value: object) -> str:
    """A number as a reviewer reads it: thousands separated and whole from 100 up (2,346, not 2346.1234 or
    2.346e+03), three significant digits below (0.992, 12.3, 0.00013), "—" for none; other values as text."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):  # NaN, infinities: as Python writes them
        return str(value)
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
