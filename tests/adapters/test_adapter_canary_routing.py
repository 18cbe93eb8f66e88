"""The pieces of an adapter canary that need no engine (seconds): the router sending both arms to ONE server
with each request's OpenAI `model` rewritten to the arm's adapter name and the server's key added; the
pinned served names; the one-line exit-2 refusals of `relctl canary`/`promote --onto` options that cannot
work. The canary itself on a vLLM base is in test_adapter_release.py (the story)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from release.cli import cli
from release.serving.adapters import pinned_name, split_pinned
from release.serving.router import Router, RouterServer
from release.serving.router.app import with_model


def _echo_app() -> Starlette:
    """A one-base server stand-in that answers with the `model` it was asked for and the key it was given,
    and names the adapter in X-Relctl-Adapter headers as relctl serve does."""

    async def complete(request: Request) -> Response:
        body = json.loads(await request.body())
        model = str(body.get("model"))
        adapter, version = split_pinned(model)
        return JSONResponse({"choices": [{"index": 0, "text": f"{model}|{request.headers.get('authorization')}"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
                            headers={"X-Relctl-Model": "base", "X-Relctl-Version": "1",
                                     "X-Relctl-Adapter": adapter, "X-Relctl-Adapter-Version": version or "1"})

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])


@pytest.fixture
def one_server() -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(_echo_app(), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "echo server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def test_the_router_splits_one_server_by_adapter_name(one_server: str) -> None:
    names = {"production": "tiny-llm-support", "candidate": pinned_name("tiny-llm-support", "2")}
    auth = {"Authorization": "Bearer k"}
    router = Router(one_server, one_server, candidate_weight=0.5, record_text=True, models=names,
                    headers={"production": auth, "candidate": auth})
    with RouterServer(router) as server:
        seen = {}
        for i in range(40):
            resp = httpx.post(f"{server.url}/v1/completions", timeout=10, headers={"X-Request-Id": f"r{i}"},
                              json={"model": "whatever-the-client-sent", "prompt": "x", "max_tokens": 1})
            assert resp.status_code == 200, resp.text
            side = resp.headers["x-relctl-backend"]
            seen[side] = resp.json()["choices"][0]["text"]
            # The answer's own adapter headers reach the client and name the arm's version.
            assert resp.headers["x-relctl-adapter-version"] == ("2" if side == "candidate" else "1")
    assert seen == {"production": "tiny-llm-support|Bearer k", "candidate": "tiny-llm-support:2|Bearer k"}
    for rec in router.records:
        assert rec.adapter == "tiny-llm-support" and rec.model == "base"
        assert rec.adapter_version == ("2" if rec.backend == "candidate" else "1")


def test_model_rewrite_and_pinned_names() -> None:
    assert json.loads(with_model(b'{"model": "a", "prompt": "p"}', "m:3")) == {"model": "m:3", "prompt": "p"}
    assert with_model(b'{"prompt": "p"}', None) == b'{"prompt": "p"}'
    assert with_model(b"not json", "m") == b"not json"          # the backend answers it as it would
    assert with_model(b"[1]", "m") == b"[1]"
    assert split_pinned(pinned_name("tiny-llm-support", "12")) == ("tiny-llm-support", "12")
    assert split_pinned("tiny-llm-support") == ("tiny-llm-support", None)


def test_server_options_that_cannot_work_exit_2_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--project-dir", str(tmp_path), "canary", "--server", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and result.stderr.startswith("error: canary: --server names the base server")
    result = runner.invoke(cli, ["--project-dir", str(tmp_path), "promote", "0123abcd", "--server",
                                 "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "--server: the base server of an adapter's canary" in result.stderr
