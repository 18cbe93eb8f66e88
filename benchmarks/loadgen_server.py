"""A lean known-delay OpenAI-style endpoint for benchmarks/loadgen.py: the server must not be the
bottleneck when a client is asked for 3,200 req/s on a 2-core machine (uvicorn + starlette spend
about 1 ms of CPU per streamed request there, tests/serving/delay_server.py included).

HTTP/1.1 keep-alive on asyncio protocols (uvloop when installed). POST: max_tokens SSE chunks, the
first TTFT after the request arrived and one every TPOT after it, chunked, then usage and [DONE].
GET /stats: arrival times (perf_counter) since the last POST /reset and the process CPU time;
GET /v1/models: one model with max_model_len.

    python benchmarks/loadgen_server.py READY_FILE [--ttft-ms 1] [--tpot-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

TOKEN = b'data: {"choices":[{"index":0,"text":"x"}]}\n\n'
ARRIVALS: list[float] = []


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class DelayProtocol(asyncio.Protocol):
    def __init__(self, ttft_s: float, tpot_s: float) -> None:
        self.ttft_s, self.tpot_s = ttft_s, tpot_s
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            method, path = head[0].split(" ")[:2]
            self.answer(method, path, body, now)

    def answer(self, method: str, path: str, body: bytes, now: float) -> None:
        global ARRIVALS
        assert self.transport is not None
        if method == "GET" or path == "/reset":
            if path == "/reset":
                ARRIVALS = []
            data = {"arrivals": ARRIVALS, "cpu_s": time.process_time()} if path == "/stats" else {
                "object": "list", "data": [{"id": "delay", "object": "model", "max_model_len": 4096}]}
            payload = json.dumps(data).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(payload), payload))
            return
        ARRIVALS.append(now)
        tokens = max(1, int(json.loads(body).get("max_tokens", 2)))
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
        loop = asyncio.get_running_loop()
        base = loop.time() + (now - time.perf_counter())
        loop.call_at(base + self.ttft_s, self.token, 0, tokens, base)

    def token(self, i: int, tokens: int, base: float) -> None:
        # Each token schedules the next: timers due in the same millisecond can fire out of order, and
        # the last one ends the response.
        if self.transport is None or self.transport.is_closing():
            return
        out = chunk(TOKEN)
        last = i == tokens - 1
        if not last:
            asyncio.get_running_loop().call_at(base + self.ttft_s + (i + 1) * self.tpot_s, self.token, i + 1, tokens,
                                               base)
        else:
            usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
            out += chunk(f"data: {usage}\n\n".encode()) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.transport.write(out)


async def serve(ready: Path, ttft_ms: float, tpot_ms: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: DelayProtocol(ttft_ms / 1000, tpot_ms / 1000), "127.0.0.1", 0,
                                      backlog=4096)
    ready.write_text(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ready", type=Path)
    parser.add_argument("--ttft-ms", type=float, default=1.0)
    parser.add_argument("--tpot-ms", type=float, default=1.0)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.ready, args.ttft_ms, args.tpot_ms))
    else:
        uvloop.run(serve(args.ready, args.ttft_ms, args.tpot_ms))


if __name__ == "__main__":
    main()
