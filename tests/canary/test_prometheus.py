"""The Prometheus source against a real HTTP server on 127.0.0.1 speaking Prometheus' query API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from release.canary.judge import Proportion, judge_step
from release.canary.settings import CanaryConfig
from release.canary.sources import PrometheusQueries, PrometheusSource
from release.core.errors import InputError

SERIES = {"1": [10.0, 11.0, 10.5, 9.8, 10.2, 10.9, 11.2, 10.1, 10.4, 10.7, 10.3, 10.6],
          "2": [14.0, 15.1, 14.6, 13.9, 14.8, 15.3, 14.2, 14.9, 14.4, 15.0, 14.1, 14.7]}
COUNTS = {("errors", "1"): 1, ("errors", "2"): 30, ("requests", "1"): 400, ("requests", "2"): 100}


SHAPES: dict[str, Any] = {"0": [1, 2], "1": {"status": "success", "data": 5},
                          "2": {"status": "success", "data": {"result": [5]}},
                          "3": {"status": "success", "data": {"result": [{"values": [[1]]}]}}}


class FakePrometheus(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        parsed = urlparse(self.path)
        params = {k: v[0] for k, v in parse_qs(parsed.query).items()}
        self.seen.append({"path": parsed.path, **params})
        query = params.get("query", "")
        side = "2" if 'version="2"' in query else "1"
        if "shape" in query:   # a server answering JSON of another shape (a proxy, another API)
            body = SHAPES[query.split("shape", 1)[1][0]]
        elif "broken" in query:
            body: dict[str, Any] = {"status": "error", "errorType": "bad_data", "error": "parse error at char 1"}
        elif parsed.path == "/api/v1/query_range":
            start = float(params["start"])
            values = [[start + 5 * i, str(v)] for i, v in enumerate(SERIES[side])] + [[0, "NaN"]]
            body = {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}}
        else:
            kind = "errors" if 'code!~"2.."' in query else "requests"
            value = [float(params["time"]), str(COUNTS[(kind, side)])]
            body = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": value}]}}
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakePrometheus.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_samples_from_prometheus_feed_the_judge(prometheus: str) -> None:
    source = PrometheusSource(prometheus, {"production": 'version="1"', "candidate": 'version="2"'}, resolution_s=5)
    data = source.data(1000.0, 1060.0)
    assert data["ttft_ms"] == (SERIES["1"], SERIES["2"])        # the NaN point is dropped
    assert data["error_rate"] == (Proportion(1, 400), Proportion(30, 100))
    ranged = [s for s in FakePrometheus.seen if s["path"] == "/api/v1/query_range"]
    assert ranged[0]["start"] == "1000.0" and ranged[0]["end"] == "1060.0" and ranged[0]["step"] == "5"
    instant = [s for s in FakePrometheus.seen if s["path"] == "/api/v1/query"]
    assert all("[60s]" in s["query"] and "$" not in s["query"] for s in instant)
    assert 'relctl_time_to_first_token_seconds_bucket{version="2"}' in ranged[1]["query"]
    step = judge_step(CanaryConfig().metrics, data)
    verdicts = {m.metric: m.verdict for m in step.metrics}
    assert verdicts == {"ttft_ms": "fail", "e2el_ms": "fail", "error_rate": "fail"}
    assert step.verdict == "fail"


def test_a_query_prometheus_rejects_is_one_line(prometheus: str) -> None:
    source = PrometheusSource(prometheus, {"production": 'version="1"', "candidate": 'version="2"'},
                              PrometheusQueries(latency={"ttft_ms": "broken("}))
    with pytest.raises(InputError, match="bad_data: parse error"):
        source.data(0.0, 10.0)
    with pytest.raises(InputError, match=r"prometheus http://127\.0\.0\.1:9"):
        PrometheusSource("http://127.0.0.1:9", {"production": "1", "candidate": "2"}).data(0.0, 10.0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_answer_of_another_shape_is_one_line_not_a_crash(prometheus: str, shape: str) -> None:
    """Issue 40: JSON of another shape from a server (a list, `data: 5`, a series that is no object, a pair of
    one) is exit 2 naming the URL, never exit 3 from the arithmetic after."""
    source = PrometheusSource(prometheus, {"production": 'version="1"', "candidate": 'version="2"'},
                              PrometheusQueries(latency={"ttft_ms": f"shape{shape}"}))
    with pytest.raises(InputError, match=r"prometheus http://127\.0\.0\.1:\d+/api/v1/query"):
        source.data(0.0, 10.0)
