"""Which variant `precision: auto` (and `convert.backend: auto`) releases, on synthetic rows (issue 38): the
cheapest that no other passing row dominates on cost and paired quality; ties on cost (within repeat noise,
or both capped at the sweep's top rate) break by paired quality, then memory, never by list order; a capped
sweep is said on the chosen line with its fix. In-process: the choice function over rows, nothing started.

The first fixture is the issue's measurement: every variant reached the sweep's top rate (64 req/s), the
repeat noise was a few percent, and the old rule gave the tie to the first listed (int8, -0.011) although
int4+mixed=mixed_layers:int8 was cheaper and better (+0.076).
"""

from __future__ import annotations

from typing import Any

from release.pipeline.engines import Comparison, EngineRow, choose
from release.pipeline.frontier import frontier_rows
from release.pipeline.ranking import dominates

ENGINE = "onnxruntime-genai"
MIB = 2**20


def row(precision: str, cost: float, quality: float | None, memory_mib: int, *, capped: bool = True,
        noise: float = 0.04, rate: float = 64.0) -> EngineRow:
    return EngineRow(ENGINE, precision, quality_passed=True, slo_met=True, rate=rate, cost_per_million_tokens=cost,
                     cost_per_hour=2.0, memory_per_replica_bytes=memory_mib * MIB, noise=noise, capped=capped,
                     quality=quality, limited_by="not reached" if capped else "SLO at 128 req/s")


def measured() -> list[EngineRow]:
    """Listed as the backend lists them (widest first); the cheapest and best is listed last."""
    return [row("int8", 2.331, -0.011, 40), row("int4", 2.296, -0.020, 30),
            row("int4+algo=rtn", 2.301, -0.030, 30), row("int4+mixed=mixed_layers:int8", 2.181, +0.076, 34)]


def chosen_of(rows: list[EngineRow], sweep: bool = True) -> tuple[EngineRow, Comparison]:
    comparison = Comparison("auto", rows, None, plan={"sweep": sweep})
    return choose(comparison), comparison


def test_the_cheapest_undominated_variant_is_released_not_the_first_listed() -> None:
    rows = measured()
    chosen, comparison = chosen_of(rows)
    assert chosen.precision == "int4+mixed=mixed_layers:int8"
    assert not any(dominates(other, chosen) for other in rows)
    # int8 is dominated (a tie on cost, worse paired quality) and says so; nothing reads "listed first".
    int8 = rows[0]
    assert int8.rejected is not None and int8.rejected.startswith("tie with onnxruntime-genai int4+mixed")
    assert "better paired quality (+0.0760 vs -0.0110)" in int8.rejected
    assert not any("listed first" in (r.rejected or "") for r in rows)
    line = comparison.why[0]
    assert line.startswith(f"chosen: {ENGINE} int4+mixed=mixed_layers:int8, the cheapest")
    # The capped sweep is said on the chosen line, with the fix.
    assert "the sweep was capped: 4 of 4 reached its top rate (64 req/s)" in line
    assert "widen gates.load.sweep_rates (e.g. add 128, 256)" in line


def test_the_frontier_marks_what_the_choice_takes() -> None:
    rows = measured()
    chosen, _ = chosen_of(rows)
    paired: dict[str, dict[str, Any]] = {r.label: {"outcome": "non_inferior", "metrics": {}} for r in rows}
    frontier = frontier_rows(rows, paired, chosen)
    by = {e["precision"]: e for e in frontier}
    assert by[chosen.precision]["chosen"] and by[chosen.precision]["on_frontier"]
    assert not by["int8"]["on_frontier"]  # its own frontier says dominated: the choice agrees


def test_a_cheaper_variant_beyond_the_noise_wins_over_better_quality() -> None:
    # Saturated sweeps (not capped), costs 20% apart with 2% noise each: cheaper and within the margin wins.
    rows = [row("int8", 2.40, +0.05, 40, capped=False, noise=0.02),
            row("int4", 2.00, -0.01, 30, capped=False, noise=0.02)]
    chosen, comparison = chosen_of(rows)
    assert chosen.precision == "int4"
    assert rows[0].rejected is not None and rows[0].rejected.startswith("dearer: $2.4")
    assert "its paired quality is better" in rows[0].rejected
    assert "capped" not in comparison.why[0]


def test_a_tie_on_cost_and_quality_goes_to_the_smaller_memory() -> None:
    rows = [row("int8", 2.20, 0.0, 40), row("int4", 2.25, 0.0, 30)]  # capped, equal quality
    chosen, _ = chosen_of(rows)
    assert chosen.precision == "int4"
    assert rows[0].rejected is not None and "needs less memory per replica (30.00 MiB vs 40.00 MiB)" in \
        rows[0].rejected


def test_a_fixed_rate_load_test_says_how_to_rank_by_capacity() -> None:
    rows = [row("int8", 2.20, 0.0, 40, noise=0.0), row("int4", 2.25, 0.0, 30, noise=0.0)]
    for r in rows:
        r.noise = None  # one fixed rate: no repeat measurement
    _, comparison = chosen_of(rows, sweep=False)
    assert "set gates.load.sweep: true" in comparison.why[0]


def test_rows_without_a_paired_quality_rank_on_cost_as_an_engines_comparison_does() -> None:
    # convert.backend: auto without precision: auto: no paired eval; the dearer row is "dearer", as before.
    rows = [row("fp32", 4.0, None, 40, capped=False), row("fp16", 2.0, None, 20, capped=False)]
    chosen, comparison = chosen_of(rows)
    assert chosen.precision == "fp16"
    assert rows[0].rejected is not None and rows[0].rejected.startswith("dearer: $4")
    assert comparison.why[1].startswith(f"not {ENGINE} fp32: dearer")
