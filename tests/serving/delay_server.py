"""A stand-in OpenAI endpoint with known delays, for checking the load generator's measurements.

POST /d/{ttft_ms}/{tpot_ms}/v1/completions (and /chat/completions) streams max_tokens chunks: the
first ttft_ms after the request arrived, then one every tpot_ms. It records what it actually did
(GET /truth), since even a precise sleep overshoots a little: that record is the truth to compare with.
Run: python -m tests.serving.delay_server --ready-file FILE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app() -> Starlette:
    truth: list[dict[str, Any]] = []

    async def generate(request: Request) -> Response:
        arrived = time.perf_counter()
        ttft = float(request.path_params["ttft_ms"]) / 1000
        tpot = float(request.path_params["tpot_ms"]) / 1000
        body = json.loads(await request.body())
        tokens = int(body.get("max_tokens", 8))
        chat = request.url.path.endswith("/chat/completions")

        async def chunks() -> Any:
            stamps = []
            for i in range(tokens):
                # A plain sleep (no spinning: the client under test needs the CPU); it overshoots by up
                # to ~1 ms, which is why the truth is what the stamps record, not the nominal delays.
                await asyncio.sleep(max(0.0, arrived + ttft + i * tpot - time.perf_counter()))
                stamps.append(time.perf_counter())
                choice = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
            usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            truth.append({"ttft_s": stamps[0] - arrived, "e2e_s": stamps[-1] - arrived,
                          "tpot_s": (stamps[-1] - stamps[0]) / (tokens - 1) if tokens > 1 else None})

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def get_truth(_: Request) -> Response:
        return JSONResponse(truth)

    async def reset(_: Request) -> Response:
        truth.clear()
        return JSONResponse({"ok": True})

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "delay", "object": "model"}]})

    return Starlette(routes=[
        Route("/d/{ttft_ms}/{tpot_ms}/v1/completions", generate, methods=["POST"]),
        Route("/d/{ttft_ms}/{tpot_ms}/v1/chat/completions", generate, methods=["POST"]),
        Route("/d/{ttft_ms}/{tpot_ms}/v1/models", models),
        Route("/truth", get_truth), Route("/reset", reset, methods=["POST"]),
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    asyncio.run(serve(parser.parse_args().ready_file))
