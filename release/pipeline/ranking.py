"""Which measured row a release takes: the cheapest that no other passing row dominates on cost and quality.

Two costs are **tied** (the same, as far as the measurement can tell) when they differ by less than both
rows' repeat noise together, or when both rows are **capped** at the same hourly price: the load test never
saturated either (every step of the sweep met the SLOs, or one fixed rate was offered), so each cost prices
the offered load, not what the engine can serve, and their difference is the machine's noise.

A row **dominates** another when it costs no more (cheaper beyond the tie, or tied) and its paired quality
(the oriented difference from the fp32 reference on the first margin metric, positive is better) is no
worse, and it is strictly better on one of the two. Rows without a paired quality (an engines comparison
without `precision: auto`) compare on cost alone.

The choice: among the rows no other dominates, the cheapest; rows tied with it are ranked by paired quality,
then memory per replica, and only when both are equal by the order they were listed in (deterministic, so
two runs back to back take the same row). Rows are duck-typed (release/pipeline/engines.py's EngineRow).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

from release.core.units import size


class Ranked(Protocol):
    """What ranking reads of a row."""

    @property
    def label(self) -> str: ...

    @property
    def cost_per_million_tokens(self) -> float | None: ...

    @property
    def cost_per_hour(self) -> float | None: ...

    @property
    def noise(self) -> float | None: ...

    @property
    def capped(self) -> bool: ...

    @property
    def rate(self) -> float | None: ...

    @property
    def quality(self) -> float | None: ...

    @property
    def memory_per_replica_bytes(self) -> int | None: ...


R = TypeVar("R", bound=Ranked)


def cost(row: Ranked) -> float:
    return float(row.cost_per_million_tokens or 0.0)


def band(row: Ranked, other: Ranked) -> float:
    """The two rows' repeat noises together: costs closer than this are what the machine's noise decides."""
    return float(row.noise or 0.0) + float(other.noise or 0.0)


def both_capped(row: Ranked, other: Ranked) -> bool:
    """Neither load test saturated its engine, at the same offered rate and the same hourly price: their
    costs price the same offered load."""
    return (row.capped and other.capped and row.rate == other.rate
            and row.cost_per_hour is not None and row.cost_per_hour == other.cost_per_hour)


def within_noise(row: Ranked, other: Ranked) -> bool:
    if row.noise is None or other.noise is None:  # no repeat measurement (no sweep): no noise figure
        return False
    low, high = sorted((cost(row), cost(other)))
    return low > 0 and high / low - 1 <= band(row, other)


def tied(row: Ranked, other: Ranked) -> bool:
    """Costs the measurement cannot tell apart: within both rows' repeat noise, or both capped."""
    return row is other or within_noise(row, other) or both_capped(row, other)


def why_tied(row: Ranked, other: Ranked) -> str:
    if both_capped(row, other):
        return f"both reached the load test's top rate ({_num(row.rate)} req/s): the costs price the offered load"
    return f"within the measured repeat noise (±{band(row, other):.0%})"


def _quality_order(a: Ranked, b: Ranked) -> int | None:
    """1 when a's paired quality is better, -1 worse, 0 equal (or neither has one), None when only one has one."""
    if a.quality is None and b.quality is None:
        return 0
    if a.quality is None or b.quality is None:
        return None
    return (a.quality > b.quality) - (a.quality < b.quality)


def dominates(a: Ranked, b: Ranked) -> bool:
    """a costs no more than b (cheaper beyond the tie, or tied) with paired quality no worse, and is strictly
    better on one of them."""
    if a is b:
        return False
    even = tied(a, b)
    if not even and cost(a) >= cost(b):
        return False
    order = _quality_order(a, b)
    return order is not None and order >= 0 and (not even or order > 0)


def undominated(rows: Sequence[R]) -> list[R]:
    """The rows no other row dominates (never empty for rows that are: dominance has no cycle)."""
    return [r for r in rows if not any(dominates(o, r) for o in rows)]


def pick(rows: Sequence[R]) -> R:
    """The cheapest undominated row; rows tied with it by paired quality, then memory, then listed order."""
    front = undominated(rows)
    anchor = min(front, key=cost)
    pool = [r for r in front if tied(r, anchor)]
    return min(pool, key=lambda r: (_sort_quality(r), _sort_memory(r), rows.index(r)))


def _sort_quality(row: Ranked) -> float:
    return -row.quality if row.quality is not None else math.inf


def _sort_memory(row: Ranked) -> float:
    return float(row.memory_per_replica_bytes) if row.memory_per_replica_bytes is not None else math.inf


def why_not(row: Ranked, chosen: Ranked, rows: Sequence[Ranked]) -> str:
    """Why `row` (a passing row) was not taken over `chosen`: dominated on cost and paired quality, a lost tie,
    or dearer (rows without a paired quality, an engines comparison's, are dearer or tied, never dominated)."""
    price, best = f"${cost(row):.4g}", f"${cost(chosen):.4g}"
    dominator = chosen if dominates(chosen, row) else next((o for o in rows if dominates(o, row)), None)
    if dominator is not None and dominator.quality is not None and row.quality is not None:
        other = f"${cost(dominator):.4g}"
        if tied(dominator, row):
            return (f"tie with {dominator.label} on cost ({price} vs {other}, {why_tied(row, dominator)}); "
                    f"{dominator.label} has the better paired quality ({_q(dominator)} vs {_q(row)})")
        return (f"dominated by {dominator.label}: cheaper ({other} vs {price} per million output tokens) with "
                f"paired quality no worse ({_q(dominator)} vs {_q(row)})")
    if tied(row, chosen):
        if _quality_order(chosen, row) == 1:
            because = f"{chosen.label} has the better paired quality ({_q(chosen)} vs {_q(row)})"
        elif _sort_memory(chosen) < _sort_memory(row):
            because = (f"equal paired quality; {chosen.label} needs less memory per replica "
                       f"({_bytes(chosen.memory_per_replica_bytes)} vs {_bytes(row.memory_per_replica_bytes)})")
        else:
            because = f"equal paired quality and memory; {chosen.label} is listed first"
        return f"tie with {chosen.label}: {price} vs {best} ({why_tied(row, chosen)}); {because}"
    ratio = f" ({cost(row) / cost(chosen):.2f}x)" if cost(chosen) > 0 else ""
    better = (f"; its paired quality is better ({_q(row)} vs {_q(chosen)}), and {chosen.label} is within the "
              f"margin for less" if _quality_order(row, chosen) == 1 else "")
    return f"dearer: {price} per million output tokens vs {best}{ratio}{better}"


def capped_note(rows: Sequence[Ranked], swept: bool) -> str | None:
    """The chosen line's warning when costs were capped, with the fix; None when every row saturated."""
    capped = [r for r in rows if r.capped]
    if not capped:
        return None
    top = max((r.rate for r in capped if r.rate is not None), default=None)
    if not swept:
        return (f"the load test offered one rate ({_num(top)} req/s) that {len(capped)} of {len(rows)} kept up "
                "with, so their costs price that load, not what each can serve: set gates.load.sweep: true "
                "(with sweep_rates above it) to rank them by capacity")
    higher = ", ".join(_num(top * k) for k in (2, 4)) if top else "higher rates"
    return (f"the sweep was capped: {len(capped)} of {len(rows)} reached its top rate ({_num(top)} req/s) "
            f"without missing an SLO, so their costs price the offered load, not what each can serve: widen "
            f"gates.load.sweep_rates (e.g. add {higher}) to separate them")


def _q(row: Ranked) -> str:
    return "—" if row.quality is None else f"{row.quality:+.4f}"


def _bytes(value: int | None) -> str:
    return "—" if value is None else size(value)


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:g}"
