"""Where a check's samples come from, in the judge's shape ({metric: (production, candidate)}).

`records_data`: the router's records (or any JSONL in its format, docs/canary.md).
`PrometheusSource`: a plug-in reading the same metrics from a Prometheus HTTP API, for traffic that
KServe (or a mesh) splits and relctl only judges: each latency metric is a PromQL query per side whose
values over the check's window are the samples (as Kayenta does with time series), error rate and
output quality are counters of hits and totals over the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from release.canary.judge import Proportion
from release.core.errors import InputError
from release.serving.router.records import RouterRecord

SIDES = ("production", "candidate")


def side_records(records: Iterable[RouterRecord], step: str, shadow: bool) -> dict[str, list[RouterRecord]]:
    """The step's records per side; in shadow mode the candidate's are the mirrored copies."""
    out: dict[str, list[RouterRecord]] = {side: [] for side in SIDES}
    for rec in records:
        if rec.step != step:
            continue
        if rec.backend == "production" and not rec.mirrored:
            out["production"].append(rec)
        elif rec.backend == "candidate" and rec.mirrored == shadow:
            out["candidate"].append(rec)
    return out


def records_data(records: Iterable[RouterRecord], step: str, shadow: bool, expected: Mapping[str, str]
                 ) -> dict[str, tuple[Any, Any]]:
    """Latency samples in ms (successful requests), error counts, and exact-match counts on the requests
    whose expected answer is known (after strip, as the eval gate's exact_match)."""
    sides = side_records(records, step, shadow)
    data: dict[str, tuple[Any, Any]] = {}
    for metric in ("ttft", "tpot", "e2el"):
        pair = tuple([1000.0 * v for r in sides[s] if r.ok and (v := getattr(r, f"{metric}_s")) is not None]
                     for s in SIDES)
        data[f"{metric}_ms"] = (pair[0], pair[1])
    errors = tuple(Proportion(sum(not r.ok for r in sides[s]), len(sides[s])) for s in SIDES)
    data["error_rate"] = (errors[0], errors[1])
    if expected:
        known = [[r for r in sides[s] if r.ok and r.request_id in expected] for s in SIDES]
        hits = [_exact_match(side, expected) for side in known]
        data["output_quality"] = (hits[0], hits[1])
    return data


def _exact_match(records: list[RouterRecord], expected: Mapping[str, str]) -> Proportion:
    correct = sum((r.text or "").strip() == expected[r.request_id].strip() for r in records)
    return Proportion(correct, len(records))


_MEDIAN = "histogram_quantile(0.5, sum by (le) (rate({metric}_bucket{{$side}}[30s]))) * 1000"


@dataclass(frozen=True)
class PrometheusQueries:
    """PromQL per metric with `$side` standing for the side's label matchers (e.g. `revision="m-00002"`).

    The defaults read `relctl serve`'s own /metrics (the labels that tell the sides apart come from the
    scrape: pod, revision or version relabelling). Latency queries return one series in milliseconds (a
    quantile over a short range); error and quality queries return counts over `$window`."""

    latency: dict[str, str] = field(default_factory=lambda: {
        "ttft_ms": _MEDIAN.format(metric="relctl_time_to_first_token_seconds"),
        "e2el_ms": _MEDIAN.format(metric="relctl_request_duration_seconds"),
    })
    errors: str | None = 'sum(increase(relctl_requests_total{$side,code!~"2.."}[$window]))'
    requests: str | None = "sum(increase(relctl_requests_total{$side}[$window]))"
    correct: str | None = None
    known: str | None = None


class PrometheusSource:
    """Read a check's samples from a Prometheus HTTP API (`/api/v1/query_range`, `/api/v1/query`)."""

    def __init__(self, url: str, sides: Mapping[str, str], queries: PrometheusQueries | None = None,
                 resolution_s: float = 5.0, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.sides = dict(sides)   # {"production": 'version="3"', "candidate": 'version="4"'}: for $side
        self.queries = queries or PrometheusQueries()
        self.resolution_s = resolution_s
        self.timeout_s = timeout_s

    def data(self, start: float, end: float) -> dict[str, tuple[Any, Any]]:
        """The judge's input for the window [start, end] (unix seconds)."""
        out: dict[str, tuple[Any, Any]] = {}
        for metric, query in self.queries.latency.items():
            pair = [self._range(query.replace("$side", self.sides[s]), start, end) for s in SIDES]
            out[metric] = (pair[0], pair[1])
        window = f"{max(1, round(end - start))}s"
        for metric, hits, total in (("error_rate", self.queries.errors, self.queries.requests),
                                    ("output_quality", self.queries.correct, self.queries.known)):
            if hits is None or total is None:
                continue
            counts = [Proportion(round(self._instant(hits, s, window, end)),
                                 round(self._instant(total, s, window, end))) for s in SIDES]
            out[metric] = (counts[0], counts[1])
        return out

    def _range(self, query: str, start: float, end: float) -> list[float]:
        result = self._get("/api/v1/query_range", {"query": query, "start": start, "end": end,
                                                   "step": self.resolution_s})
        return [float(v) for series in result for _, v in series.get("values", []) if _finite(v)]

    def _instant(self, query: str, side: str, window: str, at: float) -> float:
        text = query.replace("$side", self.sides[side]).replace("$window", window)
        result = self._get("/api/v1/query", {"query": text, "time": at})
        values = [float(series["value"][1]) for series in result if _finite(series["value"][1])]
        return sum(values)

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            resp = httpx.get(self.url + path, params=params, timeout=self.timeout_s)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise InputError(f"prometheus {self.url}: {exc.__class__.__name__}",
                             hint="check the Prometheus URL and that it is up") from exc
        if not isinstance(body, dict):
            raise InputError(f"prometheus {self.url}{path}: answered {type(body).__name__}, not Prometheus' JSON",
                             hint="check the Prometheus URL (its API root, not a proxy's page)")
        if body.get("status") != "success":
            raise InputError(f"prometheus: {body.get('errorType', 'error')}: {body.get('error', resp.text[:200])}",
                             hint="check the PromQL queries in the canary's Prometheus source")
        data = body.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        # Every series a dict whose `value` / `values` are [time, number] pairs, or the answer is refused whole:
        # a malformed answer is named here (exit 2), never a crash of the arithmetic after.
        if not isinstance(result, list) or not all(_series_ok(series) for series in result):
            raise InputError(f"prometheus {self.url}{path}: data.result is not a list of series with [time, value] "
                             "pairs", hint="check the Prometheus URL and the PromQL queries of the canary's source")
        return result


def _series_ok(series: Any) -> bool:
    """A Prometheus series as the API gives it: an instant `value` [t, v] or a range of `values`."""
    if not isinstance(series, dict):
        return False
    pairs = [series["value"]] if "value" in series else series.get("values", [])
    return isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs)


def _finite(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number)
