"""What to try after a refusal whose cause relctl can name, so the hint points at the fix and not at a knob."""

from __future__ import annotations

# From the fp32 reference down: each step gives up fidelity for size.
BY_FIDELITY = ("fp32", "fp16", "int8", "int4")
REFERENCE = BY_FIDELITY[0]


def after_validation_failure(precision: str) -> str:
    """The hint when the candidate at `precision` is too far from the fp32 reference.

    Below fp32 the likely cause is the precision, so the hint names the next one up (closer to the
    reference); at fp32 nothing was quantized, so the gap is the export or the thresholds."""
    if precision not in BY_FIDELITY or precision == REFERENCE:
        return (f"the {precision} candidate differs from the {REFERENCE} reference although nothing was quantized: "
                "check the export, or relax validation thresholds; the release report has every metric")
    up = BY_FIDELITY[BY_FIDELITY.index(precision) - 1]
    return (f"{precision} loses too much against the {REFERENCE} reference: {up}, the next precision up, is "
            f"closer to it (--precision {up}, or convert.precision: {up}); relax validation thresholds only if "
            f"{up} fails too")
