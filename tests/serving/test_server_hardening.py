"""Hostile requests against `relctl serve`: each is refused at once (4xx naming the field), never hangs a
generation thread, never holds an admission slot, and normal requests are served right after."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from release.core.package import verify_package
from release.core.server_settings import ServerSettings
from release.serving.app import create_app
from release.serving.metrics import Identity
from release.serving.process import ServerProcess
from release.serving.protocol import ModelLimits
from release.serving.server import load_state
from release.serving.source import ServedPackage

PROMPT = {"prompt": "the quick brown", "max_tokens": 4}
VOCAB = 320  # tests/serving/tinymodel.py trains a 320-token BPE


def deep(levels: int) -> bytes:
    return b'{"prompt": "hi", "x": ' + b"[" * levels + b"]" * levels + b"}"


# (path, raw body, the field the 400 must name). Each of these hung a worker or gave an uncounted 500 before.
CASES = [
    ("/v1/completions", json.dumps({**PROMPT, "temperature": 1, "top_k": VOCAB + 1}).encode(), "top_k"),
    ("/v1/completions", json.dumps({**PROMPT, "temperature": 1, "top_k": 2**31}).encode(), "top_k"),
    ("/v1/completions", json.dumps({**PROMPT, "temperature": 1, "top_k": 2**40}).encode(), "top_k"),
    ("/v1/completions", json.dumps({**PROMPT, "temperature": 1, "seed": 2**31}).encode(), "seed"),
    ("/v1/completions", json.dumps({**PROMPT, "temperature": 1, "seed": 2**64}).encode(), "seed"),
    ("/v1/completions", json.dumps({**PROMPT, "seed": -1}).encode(), "seed"),
    ("/v1/completions", json.dumps({**PROMPT, "max_tokens": 2048}).encode(), "max_tokens"),
    ("/v1/completions", deep(10_000), "body"),
    ("/v1/completions", deep(40), "body"),
    ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "prompt.1"),
    ("/v1/completions", b'{"prompt": "nul \\u0000 inside", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": "caf\xe9", "max_tokens": 2}', "body"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}', "body"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "body"),
    ("/v1/completions", json.dumps({**PROMPT, "stop": ["x" * 300]}).encode(), "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages.0.content"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                         "top_k": VOCAB + 1, "temperature": 0.5}).encode(), "top_k"),
]


def post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=10)


def counter(metrics: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith((name + "{", name + " ")):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.partition(" ")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize(("path", "body", "param"), CASES, ids=[f"{i}-{c[2]}" for i, c in enumerate(CASES)])
def test_hostile_request_is_a_prompt_400_naming_the_field(server: ServerProcess, path: str, body: bytes,
                                                           param: str) -> None:
    before = counter(httpx.get(f"{server.url}/metrics").text, "relctl_requests_total", code="400")
    started = time.monotonic()
    resp = post(f"{server.url}{path}", body)
    elapsed = time.monotonic() - started
    assert resp.status_code == 400, resp.text
    assert elapsed < 1.0, f"400 took {elapsed:.2f}s"
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(f"{param}:")
    assert resp.headers["x-request-id"]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert counter(metrics, "relctl_requests_total", code="400") == before + 1
    assert httpx.get(f"{server.url}/health").json()["in_flight"] == 0


def test_a_crowd_of_bad_requests_never_fills_the_queue(server: ServerProcess) -> None:
    # workers=2 + queue_size=4: 30 bad requests at once used to hold every slot until their timeout.
    async def crowd() -> tuple[list[int], int]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=60)) as client:
            bad = [client.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"})
                   for path, body, _ in CASES[:6] * 5]
            codes = [r.status_code for r in await asyncio.gather(*bad)]
            good = await client.post(f"{server.url}/v1/completions", json=PROMPT)
            return codes, good.status_code

    started = time.monotonic()
    codes, good = asyncio.run(crowd())
    assert set(codes) == {400}, codes
    assert good == 200
    assert time.monotonic() - started < 15
    assert httpx.get(f"{server.url}/health").json()["in_flight"] == 0
    assert counter(httpx.get(f"{server.url}/metrics").text, "relctl_errors_total") == 0


def test_unsupported_openai_fields_are_refused_by_name(server: ServerProcess) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refused = {"logprobs": True, "top_logprobs": 3, "tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": "auto", "response_format": {"type": "json_object"}, "n": 2,
               "functions": [{"name": "f"}], "logit_bias": {"5": 1}, "presence_penalty": 0.5}
    for name, value in refused.items():
        resp = httpx.post(f"{server.url}/v1/chat/completions", json={**chat, name: value}, timeout=10)
        assert resp.status_code == 400, (name, resp.text)
        assert resp.json()["error"]["param"] == name
    # What clients send as defaults is no reason to refuse.
    neutral = {"logprobs": None, "n": 1, "tools": None, "response_format": {"type": "text"}, "presence_penalty": 0}
    assert httpx.post(f"{server.url}/v1/chat/completions", json={**chat, **neutral}, timeout=30).status_code == 200
    # Completions implement echo and logprobs (tests/serving/test_logprobs.py); suffix stays refused.
    suffix = httpx.post(f"{server.url}/v1/completions", json={**PROMPT, "suffix": "end"}, timeout=10)
    assert suffix.status_code == 400 and suffix.json()["error"]["param"] == "suffix"


@pytest.mark.parametrize("batching", ["on", "off"])
def test_a_failing_generation_ends_its_request_at_once(tiny_package: Path, batching: str) -> None:
    """If a parameter ever slips past validation, the generation's exception (batching engine or generator
    thread) ends the request with a 500, counted and logged; its slot comes back."""
    manifest = verify_package(tiny_package)
    package = ServedPackage(manifest, Identity("tiny-llm", "unregistered", manifest.serving_config_hash))
    settings = ServerSettings(workers=1, queue_size=0, request_timeout_s=30, batching=batching,  # type: ignore[arg-type]
                              max_batch_size=1)
    state = load_state(package, settings, tiny_package)
    engine = state.engine
    # A validation gap, made on purpose: the model's real vocabulary is 320, so top_k=1000 fails in C++.
    engine.limits = ModelLimits(vocab_size=10_000, context_length=engine.context_length)
    app = create_app(state)
    bad = {**PROMPT, "temperature": 1.0, "top_k": 1000}

    async def calls() -> tuple[httpx.Response, httpx.Response, httpx.Response, str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://relctl") as client:
            whole = await client.post("/v1/completions", json=bad)
            streamed = await client.post("/v1/completions", json={**bad, "stream": True})
            ok = await client.post("/v1/completions", json=PROMPT)
            return whole, streamed, ok, (await client.get("/metrics")).text

    try:
        started = time.monotonic()
        whole, streamed, ok, metrics = asyncio.run(calls())
        assert time.monotonic() - started < 10  # the request timeout is 30 s: nothing waited for it
    finally:
        engine.close()
    assert whole.status_code == 500
    assert whole.json()["error"]["type"] == "server_error"
    assert whole.headers["x-request-id"] in whole.json()["error"]["message"]
    assert streamed.status_code == 500  # failed before any token: the status can still say so
    assert ok.status_code == 200  # the only worker is free again
    assert counter(metrics, "relctl_errors_total", kind="generation") == 2
    assert counter(metrics, "relctl_requests_total", code="500") == 2
