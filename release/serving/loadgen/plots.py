"""PNG plots of a benchmark: latency CDFs per endpoint and latency percentiles against offered rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from release.serving.loadgen.runner import RunResult

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))


def _pyplot() -> Any:
    import matplotlib  # noqa: PLC0415 - heavy: loaded only when a plot is drawn

    matplotlib.use("Agg")  # files only: no display, works headless in CI
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after use("Agg"), which must come first

    return plt


def plot_cdfs(runs: list[RunResult], path: Path) -> Path:
    """Empirical CDF of TTFT, TPOT and E2EL, one line per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
    for ax, (key, title) in zip(axes, METRICS, strict=True):
        for run in runs:
            values = [getattr(r, f"{key}_s") for r in run.records if r.ok and getattr(r, f"{key}_s") is not None]
            if values:
                xs = np.sort(np.asarray(values) * 1000.0)
                ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=run.label)
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if ax.get_lines():  # no line when no request succeeded: an empty legend only warns
            ax.legend(fontsize="small")
    return _save(fig, plt, path)


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
