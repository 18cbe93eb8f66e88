"""The load test's latency CDF names each run and draws the SLOs where they bind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from release.serving.loadgen import plots
from release.serving.loadgen.client import Record
from release.serving.loadgen.runner import RunResult
from release.serving.loadgen.summary import SLOs


def test_slo_bounds_are_the_percentile_slos_of_one_metric() -> None:
    slos = SLOs(ttft_p95_ms=200, ttft_p99_ms=500, e2el_p99_ms=9000)
    assert plots.slo_bounds(slos, "ttft") == [(95, 200.0), (99, 500.0)]
    assert plots.slo_bounds(slos, "e2el") == [(99, 9000.0)]
    assert plots.slo_bounds(slos, "tpot") == [] and plots.slo_bounds(None, "ttft") == []


def test_cdf_legend_names_runs_and_slos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real runs' records drawn: each line is labelled by its run, each SLO by its bound."""
    records = [Record(i, i * 0.5, ttft_s=0.01 * (i + 1), tpot_s=0.002, e2el_s=0.1 * (i + 1), status="ok")
               for i in range(5)]
    runs = [RunResult(label, "http://127.0.0.1:1", 2.0, records, {}, []) for label in ("v2 candidate", "v1 production")]
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read its legends
    out = plots.plot_cdfs(runs, tmp_path / "cdf.png", SLOs(ttft_p95_ms=30, e2el_p99_ms=100_000))
    assert out.read_bytes().startswith(b"\x89PNG")
    ttft, _, e2el = figures[0].axes
    assert [t.get_text() for t in ttft.get_legend().get_texts()] == [
        "v2 candidate (n=5)", "v1 production (n=5)", "SLO p95 <= 30 ms"]
    assert e2el.get_xscale() == "log"  # a bound far right of the data: a log axis keeps the curves apart
