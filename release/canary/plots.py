"""Latency CDFs of both sides for each check of a canary (PNG): what the judge compared, drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from release.canary.runner import CanaryResult
from release.canary.sources import side_records

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))
COLORS = {"production": "tab:blue", "candidate": "tab:orange"}


def plot_checks(result: CanaryResult, out_dir: Path, names: dict[str, str] | None = None) -> list[Path]:
    """One PNG per check: TTFT, TPOT and E2EL empirical CDFs, production against candidate. `names`: how
    the legend calls each side (e.g. {"production": "v3 production"}); default the side's name."""
    import matplotlib  # noqa: PLC0415 - heavy, and only needed when evidence is drawn

    matplotlib.use("Agg")  # files only: headless in CI; must precede pyplot's import
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after the backend is chosen

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for check in result.checks:
        sides = side_records(result.records, check.label, result.shadow)
        fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4))
        for ax, (key, title) in zip(axes, METRICS, strict=True):
            for side, records in sides.items():
                values = [getattr(r, f"{key}_s") for r in records if r.ok and getattr(r, f"{key}_s") is not None]
                if values:
                    xs = np.sort(np.asarray(values) * 1000.0)
                    ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), color=COLORS[side],
                            label=f"{(names or {}).get(side, side)} (n={len(xs)})")
            verdict = _verdict(check.judgement.metrics, f"{key}_ms")
            ax.set_title(f"{title} CDF, {check.label} at {check.weight:g}%: {verdict}")
            ax.set_xlabel("ms")
            ax.set_ylabel("fraction of requests")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
        fig.tight_layout()
        path = out_dir / f"latency-cdf-{check.label}.png"
        tmp = path.with_name(path.stem + ".tmp.png")
        fig.savefig(tmp, dpi=90)
        plt.close(fig)
        tmp.rename(path)
        paths.append(path)
    return paths


def _verdict(metrics: list[Any], name: str) -> str:
    return next((m.verdict for m in metrics if m.metric == name), "not judged")
