"""`relctl bench`: run, compare or sweep, then write records, a JSON summary and plots to `out_dir`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from release.core.errors import InputError
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.context import EndpointInfo, discover
from release.serving.loadgen.plots import plot_cdfs, plot_latency_vs_rate
from release.serving.loadgen.runner import (
    RunResult,
    Traffic,
    compare,
    plan_traffic,
    sweep,
    write_json,
    write_records,
)
from release.serving.loadgen.segments import Segment, read_segment, start_offset, union_records
from release.serving.loadgen.summary import SLOs, check_slos, summarize


def discover_model(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The first model id the endpoint lists at /v1/models (None when it lists none)."""
    return discover(base_url, timeout_s).model


def check_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise InputError(f"{url}: not an http(s) URL", hint="e.g. http://127.0.0.1:8000")


def run_bench(urls: list[str], traffic: Traffic, slos: SLOs, client: ClientOptions, out_dir: Path,
              do_sweep: bool = False, sweep_rates: list[float] | None = None, step_duration_s: float = 10.0,
              base_dir: Path | None = None, segment: Segment | None = None,
              start_at: float | None = None, labels: list[str] | None = None,
              repeat_best: bool = False, max_duration_s: float | None = None) -> dict[str, Any]:
    """Benchmark `urls[0]` (and compare with the rest); returns the report also written to summary.json.

    `client.base_url` is ignored (each URL is used in turn); `client.model` None: ask each endpoint.
    Synthetic prompts are sized to the smallest context the endpoints report at /v1/models.
    `segment`: send only that share of the plan, starting at the Unix time `start_at` (segments.py).
    `labels`: one per URL, as records and plots name them (e.g. "candidate", "production v3"); default host-port.
    """
    if labels is not None and (len(labels) != len(urls) or len(set(labels)) != len(labels)):
        raise InputError("bench: give one distinct label per endpoint", hint="one --label per URL")
    if not urls:
        raise InputError("bench: no endpoint URL given", hint="relctl bench http://127.0.0.1:8000")
    if do_sweep and len(urls) > 1:
        raise InputError("bench: --sweep works on one endpoint", hint="drop --compare or --sweep")
    if segment is not None and (do_sweep or len(urls) > 1):
        raise InputError("bench: --segment runs one plan against one endpoint", hint="drop --compare or --sweep")
    if start_at is not None:
        start_offset(start_at)
    for url in urls:
        check_url(url)
    if traffic.trace is not None or traffic.dataset is not None:
        plan_traffic(traffic, base_dir=base_dir)  # a bad file is reported before any endpoint is contacted
    infos = {url: _discover(url, client.model) for url in urls}
    contexts = [info.max_model_len for info in infos.values() if info.max_model_len is not None]
    context = min(contexts) if contexts else None
    endpoints = {(labels[i] if labels else _label(i, url, len(urls))):
                 replace(client, base_url=url, model=client.model or infos[url].model) for i, url in enumerate(urls)}
    report: dict[str, Any] = {"traffic": traffic.model_dump(), "slos": slos.model_dump(),
                              "client": _client_json(client), "max_model_len": context}
    if do_sweep:
        (opts,) = endpoints.values()
        result = sweep(opts, traffic, slos, step_duration_s=step_duration_s, rates=sweep_rates, base_dir=base_dir,
                       max_model_len=context, repeat_best=repeat_best, max_duration_s=max_duration_s)
        runs = result.steps
        best = result.best
        out_dir.mkdir(parents=True, exist_ok=True)
        report.update(kind="sweep", best_rate=best.rate if best else None,
                      best=best.to_json() if best else None,
                      repeat=result.repeat.to_json() if result.repeat else None, stopped=result.stopped)
        report["plots"] = [str(plot_latency_vs_rate(runs, out_dir / "latency-vs-rate.png")),
                           str(plot_cdfs(runs, out_dir / "latency-cdf.png", slos))]
    else:
        runs, digest, planned = compare(endpoints, traffic, slos, base_dir=base_dir, max_model_len=context,
                               segment=segment, start_at=start_at)
        out_dir.mkdir(parents=True, exist_ok=True)
        report.update(kind="compare" if len(runs) > 1 else "run", plan_digest=digest, plan_requests=planned,
                      plots=[str(plot_cdfs(runs, out_dir / "latency-cdf.png", slos))])
        if segment is not None:
            report.update(kind="segment", segment=segment.to_json(), start_at=start_at)
    report["runs"] = [_with_records(run, out_dir) for run in runs]
    report["passed"] = all(run.passed for run in runs) if not do_sweep else report["best_rate"] is not None
    write_json(out_dir / "summary.json", report)
    return report


def _discover(url: str, model: str | None) -> EndpointInfo:
    # With --model given, an endpoint without /v1/models still works: prompts are then not sized to it.
    try:
        return discover(url)
    except InputError:
        if model is None:
            raise
        return EndpointInfo(model, None)


def merge_segments(folders: list[Path], out_dir: Path, slos: SLOs | None = None) -> dict[str, Any]:
    """One summary from the --out folders of every segment of one plan: metrics from the union of their
    records (as one host would have reported them); written to `out_dir` like a single run."""
    runs = [read_segment(folder) for folder in folders]
    records, first = union_records(runs)
    slos = slos or SLOs.model_validate(first.get("slos") or {})
    rate = first["runs"][0]["rate"]
    summary = summarize(records, rate, slos)
    merged = RunResult("merged", first["runs"][0]["url"], rate, records, summary, check_slos(summary, slos))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "kind": "merge", "traffic": first.get("traffic"), "slos": slos.model_dump(), "client": first.get("client"),
        "plan_digest": first.get("plan_digest"), "segments": [str(run.folder) for run in runs],
        "per_segment": [{"segment": run.report["segment"], "requests": len(run.records),
                         "achieved_rate": run.report["runs"][0]["summary"]["achieved_rate"]} for run in runs],
        "plots": [str(plot_cdfs([merged], out_dir / "latency-cdf.png", slos))],
        "runs": [_with_records(merged, out_dir)]}
    report["passed"] = merged.passed
    write_json(out_dir / "summary.json", report)
    return report


def _client_json(client: ClientOptions) -> dict[str, Any]:
    return {"endpoint": client.endpoint, "stream": client.stream, "ignore_eos": client.ignore_eos,
            "max_concurrency": client.max_concurrency, "timeout_s": client.timeout_s,
            "temperature": client.temperature}


def _with_records(run: RunResult, out_dir: Path) -> dict[str, Any]:
    path = write_records(out_dir / f"records-{run.label}.jsonl", run.records)
    return {**run.to_json(), "records": str(path)}


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
