"""`relctl bench`: run, compare or sweep, then write records, a JSON summary and plots to `out_dir`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from release.errors import InputError
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.plots import plot_cdfs, plot_latency_vs_rate
from release.serving.loadgen.runner import RunResult, Traffic, compare, sweep, write_json, write_records
from release.serving.loadgen.summary import SLOs


def discover_model(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The first model id the endpoint lists at /v1/models (None when it lists none)."""
    base = base_url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    try:
        resp = httpx.get(f"{base}/models", timeout=timeout_s)
        resp.raise_for_status()
        data = resp.json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise InputError(f"{base_url}: cannot list models ({exc.__class__.__name__})",
                         hint="check the URL and that the server is up, or pass --model NAME") from exc
    return str(data[0]["id"]) if data else None


def check_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InputError(f"{url}: not an http(s) URL", hint="e.g. http://127.0.0.1:8000")


def run_bench(urls: list[str], traffic: Traffic, slos: SLOs, client: ClientOptions, out_dir: Path,
              do_sweep: bool = False, sweep_rates: list[float] | None = None, step_duration_s: float = 10.0,
              base_dir: Path | None = None) -> dict[str, Any]:
    """Benchmark `urls[0]` (and compare with the rest); returns the report also written to summary.json.

    `client.base_url` is ignored (each URL is used in turn); `client.model` None: ask each endpoint.
    """
    if not urls:
        raise InputError("bench: no endpoint URL given", hint="relctl bench http://127.0.0.1:8000")
    if do_sweep and len(urls) > 1:
        raise InputError("bench: --sweep works on one endpoint", hint="drop --compare or --sweep")
    for url in urls:
        check_url(url)
    out_dir.mkdir(parents=True, exist_ok=True)
    endpoints = {_label(i, url, len(urls)): _options(client, url) for i, url in enumerate(urls)}
    report: dict[str, Any] = {"traffic": traffic.model_dump(), "slos": slos.model_dump()}
    if do_sweep:
        (opts,) = endpoints.values()
        result = sweep(opts, traffic, slos, step_duration_s=step_duration_s, rates=sweep_rates, base_dir=base_dir)
        runs = result.steps
        best = result.best
        report.update(kind="sweep", best_rate=best.rate if best else None,
                      best=best.to_json() if best else None)
        report["plots"] = [str(plot_latency_vs_rate(runs, out_dir / "latency-vs-rate.png")),
                           str(plot_cdfs(runs, out_dir / "latency-cdf.png"))]
    else:
        runs = compare(endpoints, traffic, slos, base_dir=base_dir)
        report.update(kind="compare" if len(runs) > 1 else "run",
                      plots=[str(plot_cdfs(runs, out_dir / "latency-cdf.png"))])
    report["runs"] = [_with_records(run, out_dir) for run in runs]
    report["passed"] = all(run.passed for run in runs) if not do_sweep else report["best_rate"] is not None
    write_json(out_dir / "summary.json", report)
    return report


def _with_records(run: RunResult, out_dir: Path) -> dict[str, Any]:
    path = write_records(out_dir / f"records-{run.label}.jsonl", run.records)
    return {**run.to_json(), "records": str(path)}


def _options(client: ClientOptions, url: str) -> ClientOptions:
    model = client.model if client.model is not None else discover_model(url)
    return replace(client, base_url=url, model=model)


def _label(index: int, url: str, count: int) -> str:
    netloc = urlparse(url).netloc.replace(":", "-")
    return netloc if count == 1 else f"{index + 1}-{netloc}"


def side_by_side(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Rows of (metric, value per run) for the terminal table."""
    rows: list[tuple[str, list[str]]] = []
    runs = report["runs"]

    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)

    rows.append(("rate target/achieved", [f"{fmt(r['summary']['target_rate'])}/{fmt(r['summary']['achieved_rate'])}"
                                          for r in runs]))
    for key in ("completed", "error_rate", "request_throughput", "output_token_throughput", "goodput_rps"):
        rows.append((key, [fmt(r["summary"][key]) for r in runs]))
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "client_lag_ms", "client_queue_ms"):
        for stat in ("p50", "p90", "p95", "p99", "mean"):
            rows.append((f"{metric} {stat}", [fmt(r["summary"][metric][stat]) for r in runs]))
    rows.append(("errors", [", ".join(f"{k}={v}" for k, v in r["summary"]["errors"].items()) or "-" for r in runs]))
    rows.append(("SLOs met", ["yes" if r["passed"] else "no" for r in runs]))
    return rows
