"""`relctl serve` on a real package: OpenAI endpoints, identity on every response, limits, overload."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from release.serving.process import ServerProcess
from tests.serving.conftest import write_server_config


def sse_events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def assert_identity(resp: httpx.Response, server: ServerProcess) -> None:
    assert resp.headers["x-relctl-model"] == "tiny-llm"
    assert resp.headers["x-relctl-version"] == "unregistered"
    assert resp.headers["x-relctl-serving-config"] == server.info["serving_config"]


def test_completion_names_model_version_and_config(server: ServerProcess, tiny_package: Path) -> None:
    manifest = json.loads((tiny_package / "relctl-package.json").read_text())
    resp = httpx.post(f"{server.url}/v1/completions", json={"prompt": "the quick brown", "max_tokens": 6,
                                                            "ignore_eos": True}, timeout=30)
    assert resp.status_code == 200
    assert_identity(resp, server)
    assert server.info["serving_config"] == manifest["serving_config_hash"]
    body = resp.json()
    assert body["model"] == "tiny-llm:unregistered"
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["finish_reason"] == "length"


def test_streamed_chat_matches_whole_answer(server: ServerProcess) -> None:
    request = {"messages": [{"role": "user", "content": "alpha beta"}], "max_tokens": 12, "ignore_eos": True,
               "temperature": 0}
    whole = httpx.post(f"{server.url}/v1/chat/completions", json=request, timeout=30).json()
    streamed = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                          json={**request, "stream": True, "stream_options": {"include_usage": True}})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert_identity(streamed, server)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {"tiny-llm:unregistered"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_models_health_and_metrics(server: ServerProcess) -> None:
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-llm:unregistered"]
    health = httpx.get(f"{server.url}/health")
    assert health.json()["status"] == "ok" and health.json()["load_time_s"] > 0
    assert_identity(health, server)
    # One completion of its own: the counter must not depend on which test of the module ran first.
    assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "alpha", "max_tokens": 2},
                      timeout=30).status_code == 200
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'relctl_model_info{model="tiny-llm",serving_config="' in metrics
    assert "relctl_model_load_seconds" in metrics
    assert 'relctl_requests_total{code="200",endpoint="completions"}' in metrics


def test_stop_string_ends_the_answer_without_it(server: ServerProcess) -> None:
    base = {"prompt": "the lazy dog", "max_tokens": 40, "ignore_eos": True, "temperature": 0}
    full = httpx.post(f"{server.url}/v1/completions", json=base, timeout=30).json()["choices"][0]["text"]
    assert len(full) > 4
    stop = full[2:4]
    cut = httpx.post(f"{server.url}/v1/completions", json={**base, "stop": [stop]}, timeout=30).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == full[: full.index(stop)]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", b'{"prompt": "hi", ', "body"),
    ("/v1/completions", b'["a list"]', "body"),
    ("/v1/completions", b'{"prompt": 42}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "8"}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": "hot"}', "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -5}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000000}', "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": "fox " * 400}).encode(), "prompt"),
    ("/v1/completions", json.dumps({"prompt": "x" * 20000}).encode(), "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "model": "gpt-4"}', "model"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 7}]}', "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages.0.role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}',
     "max_completion_tokens"),
])
def test_bad_input_is_a_400_naming_the_field(server: ServerProcess, path: str, body: bytes, param: str) -> None:
    resp = httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(f"{param}:")
    assert_identity(resp, server)
    ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200


def test_burst_far_above_capacity_gets_429_then_serves_normally(server: ServerProcess) -> None:
    # workers=2 + queue_size=4: at most 6 admitted; 40 at once must be refused quickly, not time out.
    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            body = {"prompt": "the quick brown fox", "max_tokens": 400, "ignore_eos": True}
            return list(await asyncio.gather(*[client.post(f"{server.url}/v1/completions", json=body)
                                               for _ in range(40)]))

    responses = asyncio.run(burst())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    assert codes.count(429) >= 20
    assert codes.count(200) >= 2
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == 429
    assert all(r.json()["usage"]["completion_tokens"] == 400 for r in responses if r.status_code == 200)
    assert httpx.get(f"{server.url}/health").json()["in_flight"] == 0
    after = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert after.status_code == 200
    assert 'relctl_rejected_total{reason="queue_full"}' in httpx.get(f"{server.url}/metrics").text


def test_request_timeout_answers_504_and_server_recovers(tiny_package: Path, tmp_path: Path) -> None:
    config = write_server_config(tmp_path / "release.yaml", workers=1, queue_size=8, max_output_tokens=1900,
                                 request_timeout_s=0.05)

    async def crowd(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "alpha", "max_tokens": 1900, "ignore_eos": True}
            responses = await asyncio.gather(*[client.post(f"{url}/v1/completions", json=body) for _ in range(6)])
            return [r.status_code for r in responses]

    with ServerProcess(str(tiny_package), tmp_path / "srv", config=config) as proc:
        codes = asyncio.run(crowd(proc.url))
        assert 504 in codes and set(codes) <= {200, 504}, codes
        assert httpx.get(f"{proc.url}/health").json()["in_flight"] == 0
        quick = httpx.post(f"{proc.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert quick.status_code == 200


def test_client_leaving_mid_stream_frees_its_slot(server: ServerProcess) -> None:
    body = {"prompt": "alpha", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as resp:
        assert next(line for line in resp.iter_lines() if line.startswith("data: "))
    # The connection is closed with the stream unfinished: generation stops and the slot comes back.
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/health").json()["in_flight"]:
        assert time.monotonic() < deadline, "slot of a disconnected stream never came back"
        time.sleep(0.02)
    # The slot is given back before the response's own bookkeeping runs: wait for the 499 to be counted.
    counted = 'relctl_requests_total{code="499",endpoint="completions"}'
    while counted not in httpx.get(f"{server.url}/metrics").text:
        assert time.monotonic() < deadline, "the disconnected stream was never counted as 499"
        time.sleep(0.02)
