"""The router on real HTTP: split, stickiness, streaming pass-through, labels, records, shadow, admin."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from release.serving.router import Router, RouterServer, fraction, read_records, write_records
from tests.canary.backend import url


@pytest.fixture
def routed(backend: str) -> Iterator[tuple[Router, str]]:
    router = Router(url(backend, "1", 2, 1), url(backend, "2", 2, 1), record_text=True)
    with RouterServer(router) as server:
        yield router, server.url


def _complete(base: str, request_id: str, prompt: str = "reverse a b c ->", stream: bool = True,
              **extra: object) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 8, "stream": stream, **extra}
    return httpx.post(f"{base}/v1/completions", json=body, headers={"X-Request-Id": request_id}, timeout=10)


def test_split_is_sticky_and_labelled(routed: tuple[Router, str]) -> None:
    router, base = routed
    router.set_weights(candidate=0.3)
    ids = [f"r{i}" for i in range(60)]
    served = {rid: _complete(base, rid).headers["x-relctl-backend"] for rid in ids}
    for rid in ids:
        assert served[rid] == ("candidate" if fraction(rid) < 0.3 else "production")
    assert 5 < sum(v == "candidate" for v in served.values()) < 35
    again = _complete(base, "r7")
    assert again.headers["x-relctl-backend"] == served["r7"]
    # The backend's own version headers pass through beside the router's label.
    assert again.headers["x-relctl-version"] == ("2" if served["r7"] == "candidate" else "1")


def test_stream_passes_through_and_is_recorded(routed: tuple[Router, str]) -> None:
    router, base = routed
    resp = _complete(base, "s1")
    assert resp.status_code == 200
    events = [line for line in resp.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e[5:])["choices"][0]["text"] for e in events[:-1] if json.loads(e[5:])["choices"]]
    assert "".join(texts) == "c b a"
    (rec,) = [r for r in router.records if r.request_id == "s1"]
    assert rec.status == "ok" and rec.backend == "production" and rec.version == "1"
    assert rec.output_tokens == 3 and rec.text == "c b a"
    assert rec.ttft_s is not None and rec.e2el_s is not None and rec.e2el_s >= rec.ttft_s
    assert rec.first_token_at is not None and rec.first_token_at >= rec.sent_at
    assert rec.tpot_s is not None and len(rec.itl_s) == 2


def test_chunks_arrive_before_the_stream_ends(backend: str) -> None:
    # 200 ms per token: a buffering proxy would deliver the first chunk only after the last (~0.6 s).
    router = Router(url(backend, "1", 0, 200), url(backend, "2", 0, 200))
    with RouterServer(router) as server, httpx.stream(
            "POST", f"{server.url}/v1/completions", timeout=10,
            json={"prompt": "reverse a b c d ->", "max_tokens": 4, "stream": True}) as resp:
        start = time.perf_counter()
        arrivals = [time.perf_counter() - start for line in resp.iter_lines() if line.startswith("data:")]
    assert arrivals[0] < 0.3 < arrivals[-1]


def test_whole_answers_and_chat(routed: tuple[Router, str]) -> None:
    router, base = routed
    resp = _complete(base, "w1", stream=False)
    assert resp.json()["choices"][0]["text"] == "c b a"
    chat = httpx.post(f"{base}/v1/chat/completions", timeout=10, headers={"X-Request-Id": "c1"},
                      json={"messages": [{"role": "user", "content": "reverse x y ->"}], "stream": True})
    assert chat.status_code == 200 and chat.headers["x-relctl-backend"] == "production"
    recs = {r.request_id: r for r in router.records}
    assert recs["w1"].text == "c b a" and recs["w1"].ttft_s is None and recs["w1"].e2el_s is not None
    assert recs["c1"].text == "y x" and recs["c1"].path == "/v1/chat/completions"


def test_admin_endpoint_moves_weights_for_the_next_request(routed: tuple[Router, str]) -> None:
    router, base = routed
    resp = httpx.post(f"{base}/relctl/weights", json={"candidate": 1.0, "step": "all-in"}, timeout=10)
    assert resp.json()["candidate"] == 1.0
    assert _complete(base, "a1").headers["x-relctl-backend"] == "candidate"
    httpx.post(f"{base}/relctl/weights", json={"candidate": 0}, timeout=10)
    assert _complete(base, "a1").headers["x-relctl-backend"] == "production"
    bad = httpx.post(f"{base}/relctl/weights", json={"candidate": 1.5}, timeout=10)
    assert bad.status_code == 400 and "between 0 and 1" in bad.text
    assert router.candidate_weight == 0.0
    assert [r.step for r in router.records if r.request_id == "a1"] == ["all-in", "all-in"]


def test_shadow_mirrors_and_discards_the_candidates_answer(backend: str) -> None:
    router = Router(url(backend, "1", 1, 1), url(backend, "2", 1, 1, answers="wrong"), shadow_share=1.0,
                    record_text=True)
    with RouterServer(router) as server:
        resp = _complete(server.url, "m1")
        assert resp.headers["x-relctl-backend"] == "production"
        assert "c" in resp.text and resp.headers["x-relctl-version"] == "1"
        deadline = time.monotonic() + 5
        while len(router.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    recs = sorted(router.records, key=lambda r: r.backend)
    assert [(r.backend, r.mirrored, r.text) for r in recs] == [("candidate", True, "a b c"),
                                                               ("production", False, "c b a")]


def test_errors_are_recorded_with_their_kind(backend: str, tmp_path: object) -> None:
    router = Router(url(backend, "1", 1, 1), "http://127.0.0.1:9", candidate_weight=0.0)
    router_fail = Router(url(backend, "1", 1, 1, error_pct=100), url(backend, "2"))
    with RouterServer(router) as a, RouterServer(router_fail) as b:
        down = _complete(a.url, "e1", extra_pin=None)
        pinned = httpx.post(f"{a.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                            headers={"X-Relctl-Pin": "candidate"}, timeout=10)
        failing = _complete(b.url, "e2")
    assert down.status_code == 200
    assert pinned.status_code == 502 and pinned.headers["x-relctl-backend"] == "candidate"
    assert failing.status_code == 500
    kinds = {r.backend: r.status for r in router.records}
    assert kinds == {"production": "ok", "candidate": "connect"}
    assert router_fail.records[0].status == "http_5xx" and router_fail.records[0].http_status == 500
    from pathlib import Path

    path = write_records(Path(str(tmp_path)) / "r.jsonl", router.records)
    again = read_records(path)
    assert [r.status for r in again] == [r.status for r in router.records]
    assert {"backend", "request_id", "ttft_s", "e2el_s", "output_tokens", "status"} <= set(
        json.loads(path.read_text().splitlines()[0]))


def test_tokens_that_decode_to_nothing_are_an_answer_not_an_error() -> None:
    # relctl serve streams no chunk for tokens without text; only the finish chunk and usage arrive.
    from release.serving.router.records import RouterRecord
    from release.serving.router.tally import Tally

    tally = Tally(sent=100.0, keep_text=True)
    tally.feed(b'data: {"choices":[{"index":0,"finish_reason":"length","text":""}]}\n\n', 100.5)
    tally.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\ndata: [DONE]\n\n', 100.6)
    tally.finish(200)
    rec = RouterRecord(0, 0.0, sent_at=1000.0)
    tally.apply(rec)
    assert rec.status == "ok" and rec.output_tokens == 7
    assert rec.ttft_s is None and rec.e2el_s == 0.5 and rec.tpot_s is None
    empty = Tally(sent=0.0, keep_text=False)
    empty.feed(b"data: [DONE]\n\n", 1.0)
    empty.finish(200)
    assert empty.status == "empty"
