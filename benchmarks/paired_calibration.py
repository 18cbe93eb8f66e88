"""Calibrate the paired comparison (gates/paired.py): how exact "needs about N samples" is, and how often a
continuous interval misses on the side that decides non-inferiority.

  needed N   a grid of 2x2 tables at 64 rows (each discordant pattern from empty to 8+8, three accuracies,
             margins 0.02 / 0.05 / 0.1), every one the rule leaves underpowered: needed_n against the smallest
             N whose exact power reaches 80 % (tests/gates/test_paired_power.py's exact search; tables whose
             exact N is above --largest are left out: the enumeration grows as N^1.5). Baseline: the estimate
             before issue 38, n·(h/g)² from the observed interval's half-width h and gap g to -margin.
  coverage   differences drawn from a normal, a skewed (exponential, long tail on the bad side), a heavier
             one (lognormal) and a rare mode (5 % of rows lose the whole range of a [0, 1] metric) at
             10...100 rows: the share of draws whose interval's low end lies above the true mean (nominal
             2.5 %), for compare()'s interval and for the BCa bootstrap alone (the interval before issue 38).

    python benchmarks/paired_calibration.py            # about 10 minutes on 2 cores
    python benchmarks/paired_calibration.py --draws 200 --largest 800
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gates.paired import compare
from gates.paired_figures import table_scores
from gates.paired_intervals import bootstrap
from gates.samples import SampleScores
from tests.gates.test_paired_power import exact_smallest_n

RESULTS = Path(__file__).parent / "results" / "paired_calibration.json"
PATTERNS = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (0, 2), (2, 1), (1, 2), (3, 1), (1, 3), (2, 2), (3, 3), (4, 2),
            (2, 4), (5, 5), (6, 2), (0, 3), (3, 0), (0, 5), (8, 8)]


def _scaled_estimate(n: int, difference: float, low: float, high: float, margin: float) -> int | None:
    """The estimate before issue 38: the observed interval narrowing as 1/sqrt(n)."""
    half, gap = (difference - low, difference + margin) if difference > -margin else \
        (high - difference, -margin - difference)
    return None if gap <= 0 or half <= 0 else max(n + 1, math.ceil(n * (half / gap) ** 2))


def needed_n_grid(largest: int) -> dict[str, Any]:
    rows = []
    for b, c in PATTERNS:
        for accuracy in (0.5, 0.84, 0.95):
            a = max(round(accuracy * 64) - b, 0)
            d = 64 - a - b - c
            if d < 0:
                continue
            for margin in (0.02, 0.05, 0.1):
                result = compare(*table_scores(a, b, c, d), margin=margin)
                if result.outcome != "underpowered" or result.needed_n is None or result.needed_n > largest:
                    continue
                shares = np.array([a, b, c, d], dtype=float) / 64
                exact = exact_smallest_n(shares, max(8, result.needed_n // 3), margin, result.difference > -margin)
                before = _scaled_estimate(64, result.difference, *result.interval, margin)
                rows.append({"table": [a, b, c, d], "margin": margin, "exact": exact, "needed_n": result.needed_n,
                             "ratio": result.needed_n / exact, "before": before,
                             "before_ratio": None if before is None else before / exact})
    ratios = [r["ratio"] for r in rows]
    before = [r["before_ratio"] for r in rows if r["before_ratio"] is not None]
    return {"tables": len(rows), "largest_exact_n": largest, "ratio_min": min(ratios), "ratio_max": max(ratios),
            "outside_10_percent": sum(abs(r - 1) > 0.1 for r in ratios),
            "before_ratio_min": min(before), "before_ratio_max": max(before),
            "before_outside_10_percent": sum(abs(r - 1) > 0.1 for r in before),
            "baseline": "before issue 38: n*(h/g)^2, the observed interval narrowing as 1/sqrt(n)", "rows": rows}


def coverage(draws: int) -> dict[str, Any]:
    rng = np.random.default_rng(38)
    # name -> (draw n candidate - baseline differences, their true mean, the metric's bounds, baseline value)
    shapes: dict[str, tuple[Callable[[int], np.ndarray], float, tuple[float, float] | None, float]] = {
        "normal": (lambda n: rng.normal(0.0, 1.0, n), 0.0, None, 0.0),
        "exponential, bad-side tail": (lambda n: 1.0 - rng.exponential(1.0, n), 0.0, None, 0.0),
        "lognormal(0, 1), bad-side tail": (lambda n: math.exp(0.5) - rng.lognormal(0.0, 1.0, n), 0.0, None, 0.0),
        # a [0, 1] metric on which 5 % of rows go from 1 to 0: most draws of few rows show no difference at all
        "5 % of rows lose 1 of [0, 1]": (lambda n: -(rng.random(n) < 0.05).astype(float), -0.05, (0.0, 1.0), 1.0),
    }
    out: dict[str, Any] = {}
    for name, (draw, truth, bounds, level) in shapes.items():
        for n in (10, 20, 30, 50, 100):
            ids = tuple(str(i) for i in range(n))
            baseline = SampleScores("m", "continuous", True, ids, (level,) * n, bounds)
            missed = missed_bootstrap = 0
            for seed in range(draws):
                x = draw(n)
                candidate = SampleScores("m", "continuous", True, ids, tuple(level + x), bounds)
                missed += compare(candidate, baseline, margin=0.0, seed=seed).interval[0] > truth
                missed_bootstrap += bootstrap(x, 0.95, seed)[0] > truth
            out[f"{name}, n={n}"] = {"miss_low": missed / draws, "miss_low_bootstrap_alone": missed_bootstrap / draws}
    return {"draws": draws, "nominal_miss_low": 0.025, "cases": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1000, help="draws per coverage case")
    parser.add_argument("--largest", type=int, default=2500, help="largest needed N searched exactly")
    args = parser.parse_args()
    started = time.perf_counter()
    results = {"needed_n": needed_n_grid(args.largest), "coverage": coverage(args.draws)}
    results["seconds"] = round(time.perf_counter() - started, 1)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    summary = {k: v for k, v in results["needed_n"].items() if k != "rows"}
    print(json.dumps({"needed_n": summary, "coverage": results["coverage"]["cases"]}, indent=2))


if __name__ == "__main__":
    main()
