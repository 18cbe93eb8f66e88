"""Memory vs concurrency for each precision, against the target's budget and capacity (PNG)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from release.backends.onnxruntime_genai.plan import breakdown, spec_at
from release.backends.onnxruntime_genai.verdict import MemoryPlan
from release.backends.planning import GIB


def plot_plan(plan: MemoryPlan, out: Path, overlap_bytes: int | None = None) -> Path:
    """Write the plot for `plan` to `out` (matplotlib, Agg backend: no display needed)."""
    import matplotlib  # noqa: PLC0415 - plotting is optional; matplotlib loads only for a plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after use("Agg"), so no display is needed

    t = plan.target
    top = max(2 * t.concurrency, 2 * max((a.max_concurrency for a in plan.alternatives), default=1), 8)
    points = sorted({max(1, round(top * i / 48)) for i in range(49)})
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for alt in plan.alternatives:
        spec = spec_at(plan.spec, alt.precision, t.provider)
        peaks = [breakdown(spec, replace(t, concurrency=c), overlap_bytes).peak / GIB for c in points]
        style = "-" if alt.precision == plan.spec.precision else "--"
        ax.plot(points, peaks, style, label=f"{alt.precision} (fits {alt.max_concurrency})")
    ax.axhline(plan.breakdown.budget / GIB, color="black", linewidth=1, label=f"budget ({t.headroom:.0%} headroom)")
    ax.axhline(plan.breakdown.capacity / GIB, color="grey", linewidth=1, linestyle=":", label="capacity")
    ax.axvline(t.concurrency, color="red", linewidth=1, linestyle=":", label=f"target {t.concurrency}")
    ax.set_xlabel(f"concurrent sequences at {t.context} tokens")
    ax.set_ylabel("peak memory (GiB)" + (", rollout overlap included" if t.rollout_overlap else ""))
    ax.set_ylim(0, plan.breakdown.capacity / GIB * 1.6)
    device = f"{t.gpus} x {t.gpu_name or f'{t.memory_gib:g} GiB'}"
    ax.set_title(f"memory vs concurrency on {device}")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
