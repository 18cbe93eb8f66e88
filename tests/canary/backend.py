"""A stand-in OpenAI endpoint for canary tests: known delays, a known error share, right or wrong answers.

POST /b/{version}/{ttft_ms}/{tpot_ms}/{error_pct}/{answers}/v1/completions (and /chat/completions):
  - the first token ttft_ms after arrival, then one every tpot_ms (SSE, or one JSON body at the end);
  - error_pct percent of request ids (by a stable hash of X-Request-Id) answer 500 at once;
  - prompts "reverse a b c ->" are answered "c b a" (answers=right) or "a b c" (answers=wrong), then EOS;
    other prompts get max_tokens "x" tokens; ignore_eos pads every answer to max_tokens;
  - responses carry X-Relctl-Model / X-Relctl-Version like `relctl serve`.
Run: python -m tests.canary.backend --ready-file FILE
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PREFIX = "/b/{version}/{ttft_ms}/{tpot_ms}/{error_pct}/{answers}/v1"


def answer_words(prompt: str, answers: str) -> list[str]:
    words = prompt.split()
    if len(words) >= 2 and words[0] == "reverse" and words[-1] == "->":
        letters = words[1:-1]
        return letters[::-1] if answers == "right" else letters
    return []


def _failing(request_id: str, error_pct: float) -> bool:
    digest = hashlib.blake2b(f"err{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < error_pct / 100


def create_app() -> Starlette:
    async def generate(request: Request) -> Response:
        arrived = time.perf_counter()
        p = request.path_params
        ttft, tpot = float(p["ttft_ms"]) / 1000, float(p["tpot_ms"]) / 1000
        headers = {"X-Relctl-Model": f"delay:{p['version']}", "X-Relctl-Version": str(p["version"]),
                   "X-Relctl-Serving-Config": "test"}
        if _failing(request.headers.get("x-request-id", ""), float(p["error_pct"])):
            return JSONResponse({"error": {"message": "injected failure", "code": 500}}, 500, headers=headers)
        body = json.loads(await request.body())
        chat = request.url.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        limit = int(body.get("max_tokens", 8))
        words = answer_words(prompt, p["answers"]) or ["x"] * limit
        if body.get("ignore_eos"):
            words = (words + ["x"] * limit)[:limit]
        words = words[:limit]
        pieces = [w if i == 0 else f" {w}" for i, w in enumerate(words)]
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(pieces),
                 "total_tokens": len(pieces) + len(prompt.split())}

        async def chunks() -> Any:
            for i, piece in enumerate(pieces):
                await asyncio.sleep(max(0.0, arrived + ttft + i * tpot - time.perf_counter()))
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(chunks(), media_type="text/event-stream", headers=headers)
        await asyncio.sleep(max(0.0, arrived + ttft + (len(pieces) - 1) * tpot - time.perf_counter()))
        text = "".join(pieces)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
        return JSONResponse({"choices": [choice], "usage": usage}, headers=headers)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": f"delay:{request.path_params['version']}"}]})

    return Starlette(routes=[
        Route(PREFIX + "/completions", generate, methods=["POST"]),
        Route(PREFIX + "/chat/completions", generate, methods=["POST"]),
        Route(PREFIX + "/models", models),
    ])


async def serve(ready_file: Path) -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False, backlog=4096))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    ready_file.write_text(json.dumps({"url": f"http://127.0.0.1:{port}"}))
    await task


def url(base: str, version: str = "1", ttft_ms: float = 5, tpot_ms: float = 1, error_pct: float = 0,
        answers: str = "right") -> str:
    """The base URL of one simulated backend on the shared test server."""
    return f"{base}/b/{version}/{ttft_ms:g}/{tpot_ms:g}/{error_pct:g}/{answers}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    asyncio.run(serve(parser.parse_args().ready_file))
