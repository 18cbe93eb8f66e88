"""Benchmark: throughput and TTFT of `relctl serve` with batching on and off, against onnxruntime-genai's
Engine in-process, at concurrency 1, 2, 4 and 8 — same model, same prompts, one run.

A random Llama (hidden 512, 8 layers by default: a few ms per token on CPU) is built and packaged. At each
concurrency C, C closed-loop clients each send --requests-per-client streamed requests of --tokens output
tokens (EOS ignored; sampled with temperature 1 and top_k 50, no seed: greedy decoding of random weights
loops on tokens that decode to no text, and a stream without text has no first token to time):
  engine    og.Engine in this process: C requests resident, a new one begun as soon as one finishes
  batched   relctl serve, serving.server.batching: on (the same og.Engine behind HTTP/SSE)
  threads   relctl serve, batching: off, workers = 8 (one generator thread per request in flight)
TTFT: send (or begin_turn) to the first non-empty text; tokens/s: output tokens of the level / its wall
time. The HTTP client is a lean asyncio one (see LeanClient); the server's own Server-Timing header
splits its part of the TTFT into prepare (read, parse, validate, tokenize) and first-token (admission,
queue, prefill, thread hops). Levels run engine, batched, threads back to back, so machine-load drift
affects all three alike.
Written to benchmarks/results/server_throughput.json with the load average (the machine may be shared).

    python benchmarks/server_throughput.py
    python benchmarks/server_throughput.py --hidden 256 --layers 4 --requests-per-client 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.server_overhead import build_package_in_child, prompts
from release.serving.process import ServerProcess

RESULTS = Path(__file__).parent / "results" / "server_throughput.json"
LEVELS = (1, 2, 4, 8)
THREAD_WORKERS = 8
SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(ttfts: list[float], tokens: int, wall_s: float) -> dict[str, float]:
    return {"requests": len(ttfts), "output_tokens": tokens, "wall_s": round(wall_s, 3),
            "tokens_per_s": round(tokens / wall_s, 1), "ttft_ms_p50": round(statistics.median(ttfts) * 1e3, 2),
            "ttft_ms_p99": round(percentile(ttfts, 99) * 1e3, 2)}


def run_engine(model: Any, tokenizer: Any, texts: list[str], concurrency: int, per_client: int,
               tokens: int) -> dict[str, float]:
    """C requests resident in og.Engine, closed loop: each finished one is replaced at once."""
    import numpy as np
    import onnxruntime_genai as og

    engine = og.Engine(model)
    buffer = engine.create_event_buffer(256)
    todo = [texts[i % len(texts)] for i in range(concurrency * per_client)]
    live: dict[int, dict[str, Any]] = {}
    ttfts: list[float] = []
    produced = 0

    def begin(text: str) -> None:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(tokens)
        options.set_min_generated_tokens(tokens)
        options.set_do_sample(True)
        options.set_temperature(SAMPLING["temperature"])
        options.set_top_k(SAMPLING["top_k"])
        sent = time.perf_counter()  # before tokenizing, as the server's TTFT includes its tokenizer call
        request.begin_turn(np.asarray(tokenizer.encode(text), dtype=np.int32), options)
        live[id(request)] = {"request": request, "sent": sent, "stream": tokenizer.create_stream(), "first": None}

    started = time.perf_counter()
    while todo and len(live) < concurrency:
        begin(todo.pop())
    while live:
        for event in engine.run(buffer):
            entry = live[id(event.request)]
            if event.flags & og.EngineEventFlags.TOKEN:
                produced += 1
                if entry["first"] is None and entry["stream"].decode(int(event.token)):
                    entry["first"] = time.perf_counter()
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                ttfts.append(entry["first"] - entry["sent"])
                entry["request"].close()
                del live[id(event.request)]
                if todo:
                    begin(todo.pop())
    return summarize(ttfts, produced, time.perf_counter() - started)


class LeanClient:
    """HTTP/1.1 keep-alive client on asyncio streams: pre-encoded request, chunked SSE read with byte
    searches, so the client's own CPU (which competes with the server on a small machine) stays small."""

    NON_EMPTY_TEXT = re.compile(rb'"text":"(?!")')
    USAGE = re.compile(rb'"completion_tokens":(\d+)')

    def __init__(self, url: str) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, body: bytes) -> tuple[float, int, str]:
        """(TTFT s, output tokens, the Server-Timing header) of one streamed completion."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        sent = time.perf_counter()
        self.writer.write(head + body)
        headers = await self.reader.readuntil(b"\r\n\r\n")
        assert headers.startswith(b"HTTP/1.1 200"), headers
        timing = next((line.split(b":", 1)[1].strip().decode() for line in headers.split(b"\r\n")
                       if line.lower().startswith(b"server-timing:")), "")
        first, count = None, 0
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                break
            if first is None and self.NON_EMPTY_TEXT.search(data):
                first = time.perf_counter()
            found = self.USAGE.search(data)
            if found:
                count = int(found.group(1))
        assert first is not None
        return first - sent, count, timing

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def request_body(text: str, tokens: int) -> bytes:
    return json.dumps({"prompt": text, "max_tokens": tokens, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, **SAMPLING}).encode()


def run_served(url: str, texts: list[str], concurrency: int, per_client: int, tokens: int) -> dict[str, Any]:
    async def client_loop(index: int, out: list[tuple[float, int, str]]) -> None:
        client = LeanClient(url)
        try:
            for j in range(per_client):
                body = request_body(texts[(index * per_client + j) % len(texts)], tokens)
                out.append(await client.request(body))
        finally:
            await client.close()

    async def level() -> tuple[list[tuple[float, int, str]], float]:
        out: list[tuple[float, int, str]] = []
        started = time.perf_counter()
        await asyncio.gather(*[client_loop(i, out) for i in range(concurrency)])
        return out, time.perf_counter() - started

    out, wall = asyncio.run(level())
    assert all(count == tokens for _, count, _ in out), [c for _, c, _ in out]
    summary: dict[str, Any] = summarize([t for t, _, _ in out], sum(c for _, c, _ in out), wall)
    summary["server_timing_ms_p50"] = server_timing(t for _, _, t in out)
    return summary


def server_timing(headers: Iterable[str]) -> dict[str, float]:
    """Median of each Server-Timing metric (prepare, first-token) over the requests."""
    values: dict[str, list[float]] = {}
    for header in headers:
        for name, dur in re.findall(r"([\w-]+);dur=([\d.]+)", header):
            values.setdefault(name, []).append(float(dur))
    return {name: round(statistics.median(v), 2) for name, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=3)
    args = parser.parse_args()
    import onnxruntime_genai as og
    import yaml

    texts = prompts(16)
    results: dict[str, dict[str, dict[str, float]]] = {"engine": {}, "batched": {}, "threads": {}}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        package = build_package_in_child(work / "model", args.hidden, args.layers)
        configs = {}
        for name, server in (("batched", {"batching": "on", "max_batch_size": max(LEVELS)}),
                             ("threads", {"batching": "off", "workers": THREAD_WORKERS})):
            configs[name] = work / f"{name}.yaml"
            configs[name].write_text(yaml.safe_dump({"serving": {"server": {
                **server, "queue_size": 16, "max_output_tokens": args.tokens, "request_timeout_s": 300}}}))
        model = og.Model(str(package / "model"))
        tokenizer = og.Tokenizer(model)
        with ServerProcess(str(package), work / "batched", config=configs["batched"]) as batched, \
                ServerProcess(str(package), work / "threads", config=configs["threads"]) as threads:
            for url in (batched.url, threads.url):  # warm both servers and the in-process engine
                run_served(url, texts, 2, 1, args.tokens)
            run_engine(model, tokenizer, texts, 2, 1, args.tokens)
            for c in LEVELS:
                results["engine"][str(c)] = run_engine(model, tokenizer, texts, c, args.requests_per_client,
                                                       args.tokens)
                results["batched"][str(c)] = run_served(batched.url, texts, c, args.requests_per_client, args.tokens)
                results["threads"][str(c)] = run_served(threads.url, texts, c, args.requests_per_client, args.tokens)
                print(c, {k: v[str(c)] for k, v in results.items()}, flush=True)
            batch_stats = httpx.get(f"{batched.url}/health").json()["batching"]
    top = str(max(LEVELS))
    e, b, t = (results[k][top]["tokens_per_s"] for k in ("engine", "batched", "threads"))
    ttft_added = results["batched"]["1"]["ttft_ms_p50"] - results["engine"]["1"]["ttft_ms_p50"]
    result = {
        "benchmark": "relctl serve: batching on vs off vs og.Engine in-process, closed loop",
        "model": {"hidden": args.hidden, "layers": args.layers, "precision": "fp32"},
        "tokens_per_request": args.tokens, "requests_per_client": args.requests_per_client,
        "thread_pool_workers": THREAD_WORKERS, "levels": results, "server_batch_stats": batch_stats,
        "at_concurrency_8": {"batched_over_threads": round(b / t, 2),
                             "batched_vs_engine_pct": round((b / e - 1) * 100, 1)},
        "ttft_added_by_server_ms_p50_at_1": round(ttft_added, 2),
        "targets": {"batched >= 2x threads at 8": b >= 2 * t, "batched within 15% of engine at 8": b >= 0.85 * e,
                    "TTFT added <= 3 ms p50 at 1": ttft_added <= 3.0},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
