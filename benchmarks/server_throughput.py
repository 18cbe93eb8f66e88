"""Benchmark: throughput and TTFT of `relctl serve` with batching on and off, against onnxruntime-genai's
Engine in-process, at concurrency 1, 2, 4 and 8 — same model, same prompts, one run.

A random Llama (hidden 512, 8 layers by default: a few ms per token on CPU) is built and packaged. Modes:
  engine      og.Engine in this process: C requests resident, a new one begun as soon as one finishes
  batched     relctl serve, serving.server.batching: on (the same og.Engine behind HTTP/SSE)
  batched-1t  the same with serving.server.intra_op_threads: 1 (no ONNX Runtime worker thread spinning
              between steps on the cores the server's event loop and the client need)
  threads     relctl serve, batching: off, workers = 8 (one generator thread per request in flight)
Throughput: at each concurrency C the modes take turns for --rounds rounds (order rotated per round, so
machine-load drift hits all alike); in a round C closed-loop clients send --requests-per-round streamed
requests of --tokens output tokens (EOS ignored; temperature 1, top_k 50, no seed: greedy decoding of
random weights loops on tokens that decode to no text, which has no first token to time). tokens/s is
the median over rounds of output tokens / wall time; TTFT percentiles pool the rounds.
TTFT at concurrency 1: paired single requests, each prompt in-process and then through each server; the
added TTFT is the median per-prompt difference. TTFT: send (or tokenize + begin_turn) to the first
non-empty text. The HTTP client is a lean asyncio one (LeanClient); the server's Server-Timing header
splits its own part into prepare (read, parse, validate, tokenize) and first-token (admission, queue,
prefill, thread hops).
Written to benchmarks/results/server_throughput.json with the load average (the machine may be shared).

    python benchmarks/server_throughput.py
    python benchmarks/server_throughput.py --hidden 256 --layers 4 --rounds 1 --ttft-requests 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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


Sample = tuple[list[float], int, float, list[str]]  # TTFTs (s), output tokens, wall time (s), Server-Timing


def summarize(rounds: list[Sample]) -> dict[str, Any]:
    """tokens/s: median over the rounds (robust to another process's burst); TTFT: pooled percentiles."""
    ttfts = [t for r in rounds for t in r[0]]
    out: dict[str, Any] = {
        "requests": len(ttfts), "rounds": len(rounds), "output_tokens": sum(r[1] for r in rounds),
        "tokens_per_s": round(statistics.median(r[1] / r[2] for r in rounds), 1),
        "tokens_per_s_rounds": [round(r[1] / r[2], 1) for r in rounds],
        "ttft_ms_p50": round(statistics.median(ttfts) * 1e3, 2), "ttft_ms_p99": round(percentile(ttfts, 99) * 1e3, 2)}
    headers = [h for r in rounds for h in r[3]]
    if headers:
        out["server_timing_ms_p50"] = server_timing(headers)
    return out


def run_engine(model: Any, tokenizer: Any, texts: list[str], concurrency: int, per_client: int,
               tokens: int) -> Sample:
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
                ttfts.append(entry["first"] - entry["sent"] if entry["first"] is not None else math.nan)
                entry["request"].close()
                del live[id(event.request)]
                if todo:
                    begin(todo.pop())
    return ttfts, produced, time.perf_counter() - started, []


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
        # No text at all in a short answer: NaN, which the paired TTFT leaves out (and throughput refuses).
        return (first - sent if first is not None else float("nan")), count, timing

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def request_body(text: str, tokens: int) -> bytes:
    return json.dumps({"prompt": text, "max_tokens": tokens, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}, **SAMPLING}).encode()


def run_served(url: str, texts: list[str], concurrency: int, per_client: int, tokens: int) -> Sample:
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
    assert tokens < 32 or not any(math.isnan(t) for t, _, _ in out), "a long answer without any text"
    return [t for t, _, _ in out], sum(c for _, c, _ in out), wall, [h for _, _, h in out]


def server_timing(headers: Iterable[str]) -> dict[str, float]:
    """Median of each Server-Timing metric (prepare, first-token) over the requests."""
    values: dict[str, list[float]] = {}
    for header in headers:
        for name, dur in re.findall(r"([\w-]+);dur=([\d.]+)", header):
            values.setdefault(name, []).append(float(dur))
    return {name: round(statistics.median(v), 2) for name, v in values.items()}


def paired_ttft(model: Any, tokenizer: Any, servers: dict[str, ServerProcess], texts: list[str],
                count: int) -> dict[str, Any]:
    """TTFT at concurrency 1, paired: each prompt in-process, then through each server, one request at a
    time (8 output tokens); the added TTFT is the median of the per-prompt differences, so load drift
    between prompts cancels out. A prompt whose answer has no text on some side is left out."""
    ttfts: dict[str, list[float]] = {"engine": [], **{name: [] for name in servers}}
    timing: dict[str, list[str]] = {name: [] for name in servers}
    for i in range(count):
        text = texts[i % len(texts)]
        ttfts["engine"].append(run_engine(model, tokenizer, [text], 1, 1, 8)[0][0])
        for name, server in servers.items():
            got = run_served(server.url, [text], 1, 1, 8)
            ttfts[name].append(got[0][0])
            timing[name].extend(got[3])
    keep = [i for i in range(count) if not any(math.isnan(v[i]) for v in ttfts.values())]
    ttfts = {k: [v[i] for i in keep] for k, v in ttfts.items()}
    return {
        "requests": count, "pairs_with_text": len(keep),
        "ttft_ms_p50": {k: round(statistics.median(v) * 1e3, 2) for k, v in ttfts.items()},
        "added_ms_p50": {name: round(statistics.median(s - e for s, e in zip(ttfts[name], ttfts["engine"],
                                                                           strict=True)) * 1e3, 2)
                         for name in servers},
        "server_timing_ms_p50": {name: server_timing(timing[name]) for name in servers},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per level, modes in rotated order")
    parser.add_argument("--requests-per-round", type=int, default=8, help="requests per mode and round")
    parser.add_argument("--ttft-requests", type=int, default=30, help="paired single requests for TTFT")
    args = parser.parse_args()
    import onnxruntime_genai as og
    import yaml

    texts = prompts(16)
    results: dict[str, dict[str, dict[str, Any]]] = {"engine": {}, "batched": {}, "batched-1t": {}, "threads": {}}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        package = build_package_in_child(work / "model", args.hidden, args.layers)
        configs = {}
        for name, server in (("batched", {"batching": "on", "max_batch_size": max(LEVELS)}),
                             ("batched-1t", {"batching": "on", "max_batch_size": max(LEVELS), "intra_op_threads": 1}),
                             ("threads", {"batching": "off", "workers": THREAD_WORKERS})):
            configs[name] = work / f"{name}.yaml"
            configs[name].write_text(yaml.safe_dump({"serving": {"server": {
                **server, "queue_size": 16, "max_output_tokens": args.tokens,
                "default_max_tokens": min(16, args.tokens), "request_timeout_s": 300}}}))
        model = og.Model(str(package / "model"))
        tokenizer = og.Tokenizer(model)
        servers = {name: ServerProcess(str(package), work / name, config=path).start()
                   for name, path in configs.items()}
        try:
            for server in servers.values():  # warm every server and the in-process engine
                run_served(server.url, texts, 2, 1, args.tokens)
            run_engine(model, tokenizer, texts, 2, 1, args.tokens)
            ttft = paired_ttft(model, tokenizer, servers, texts, args.ttft_requests)
            for c in LEVELS:
                per_client = max(1, -(-args.requests_per_round // c))
                samples: dict[str, list[Sample]] = {mode: [] for mode in results}
                for r in range(args.rounds):
                    modes = list(results)
                    for mode in modes[r % len(modes):] + modes[: r % len(modes)]:  # rotate the order per round
                        samples[mode].append(
                            run_engine(model, tokenizer, texts, c, per_client, args.tokens) if mode == "engine"
                            else run_served(servers[mode].url, texts, c, per_client, args.tokens))
                for mode in results:
                    results[mode][str(c)] = summarize(samples[mode])
                print(c, {k: v[str(c)]["tokens_per_s"] for k, v in results.items()}, flush=True)
            batch_stats = httpx.get(f"{servers['batched'].url}/health").json()["batching"]
        finally:
            for server in servers.values():
                server.stop()
    top = str(max(LEVELS))
    e, b, b1, t = (results[k][top]["tokens_per_s"] for k in ("engine", "batched", "batched-1t", "threads"))
    result = {
        "benchmark": "relctl serve: batching on vs off vs og.Engine in-process, closed loop",
        "model": {"hidden": args.hidden, "layers": args.layers, "precision": "fp32"},
        "tokens_per_request": args.tokens, "rounds": args.rounds, "requests_per_round": args.requests_per_round,
        "thread_pool_workers": THREAD_WORKERS, "levels": results, "server_batch_stats": batch_stats,
        "at_concurrency_8": {"batched_over_threads": round(b / t, 2),
                             "batched_vs_engine_pct": round((b / e - 1) * 100, 1),
                             "batched_1_thread_over_threads": round(b1 / t, 2),
                             "batched_1_thread_vs_engine_pct": round((b1 / e - 1) * 100, 1)},
        "ttft_at_concurrency_1": ttft,
        "targets": {"batched >= 2x threads at 8": b >= 2 * t, "batched within 15% of engine at 8": b >= 0.85 * e,
                    "TTFT added <= 3 ms p50 at 1": ttft["added_ms_p50"]["batched"] <= 3.0},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
