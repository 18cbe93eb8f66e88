"""PNG plots of a benchmark: latency CDFs per endpoint and latency percentiles against offered rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from release.serving.loadgen.runner import RunResult
from release.serving.loadgen.summary import SLOs

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))


def _pyplot() -> Any:
    import matplotlib  # noqa: PLC0415 - heavy: loaded only when a plot is drawn

    matplotlib.use("Agg")  # files only: no display, works headless in CI
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after use("Agg"), which must come first

    return plt


def plot_cdfs(runs: list[RunResult], path: Path, slos: SLOs | None = None) -> Path:
    """Empirical CDF of TTFT, TPOT and E2EL, one line per run (named by its label, n requests), with
    each percentile SLO drawn where it binds: a line at the bound, a marker at its percentile."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
    for ax, (key, title) in zip(axes, METRICS, strict=True):
        top = 0.0
        for run in runs:
            values = [getattr(r, f"{key}_s") for r in run.records if r.ok and getattr(r, f"{key}_s") is not None]
            if values:
                xs = np.sort(np.asarray(values) * 1000.0)
                top = max(top, float(xs[-1]))
                ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{run.label} (n={len(xs)})")
        bounds = slo_bounds(slos, key)
        if top > 0 and any(bound > 5 * top for _, bound in bounds):
            ax.set_xscale("log")  # a loose SLO far right of the data would squash every curve into one line
        for pct, bound in bounds:
            ax.axvline(bound, color="red", linestyle=":", linewidth=1)
            ax.plot([bound], [pct / 100], marker="v", color="red", linestyle="none",
                    label=f"SLO p{pct} <= {bound:g} ms")
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if ax.get_lines():  # no line when no request succeeded: an empty legend only warns
            ax.legend(fontsize="small")
    return _save(fig, plt, path)


def slo_bounds(slos: SLOs | None, key: str) -> list[tuple[int, float]]:
    """[(percentile, bound in ms)] of the SLOs set on metric `key` (ttft, tpot, e2el)."""
    if slos is None:
        return []
    found = [(pct, getattr(slos, f"{key}_p{pct}_ms")) for pct in (95, 99)]
    return [(pct, float(bound)) for pct, bound in found if bound is not None]


def plot_latency_vs_rate(steps: list[RunResult], path: Path) -> Path:
    """p50 and p99 of TTFT, TPOT and E2EL against the offered rate of each sweep step."""
    plt = _pyplot()
    ordered = sorted((s for s in steps if s.rate is not None), key=lambda s: s.rate or 0.0)
    rates = [s.rate for s in ordered]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
    for ax, (key, title) in zip(axes, METRICS, strict=True):
        for pct, style in (("p50", "o-"), ("p99", "s--")):
            values = [s.summary[f"{key}_ms"][pct] for s in ordered]
            ax.plot(rates, [float("nan") if v is None else v for v in values], style, label=pct)
        for s in ordered:
            if not s.passed:
                ax.axvline(s.rate, color="red", alpha=0.15)
        ax.set_title(f"{title} vs rate (red: SLO missed)")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.rename(path)
    return path
