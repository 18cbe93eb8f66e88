"""Benchmark: what `relctl serve` costs over calling onnxruntime-genai directly, same model and prompts.

A random Llama (hidden 512, 8 layers: a few ms per token on CPU, so the model, not Python, dominates as
with real models) is converted with onnxruntime-genai's builder and packaged. For each prompt, greedy
generation of --tokens tokens (EOS ignored) at concurrency 1:
  direct  og.Generator in this process: encode, generate token by token, decode incrementally
  served  POST /v1/completions with stream=true to `relctl serve` (a child process, one worker), read
          with httpx: TTFT at the first content chunk, E2E at the last
Both sample with the same seed and settings, so they generate the same tokens. Rounds alternate direct and
served per prompt so machine load drifts affect both alike. Medians of
TTFT, of tokens/s (output tokens / E2E) and of CPU time per token (this process for direct, the
server process for served: robust to other load on a shared machine) and the overheads are written to
benchmarks/results/server_overhead.json (with the load average: the machine may be shared).

    python benchmarks/server_overhead.py
    python benchmarks/server_overhead.py --hidden 256 --layers 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from release.serving.process import ServerProcess
from tests.serving.tinymodel import WORDS

RESULTS = Path(__file__).parent / "results" / "server_overhead.json"
# Seeded sampling on both paths: greedy decoding of random weights loops on tokens that decode to no
# text, and a stream without text has no first token to time.
SAMPLING: dict[str, Any] = {"do_sample": True, "temperature": 1.0, "top_k": 50, "random_seed": 1}


def prompts(count: int) -> list[str]:
    return [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(4 + (i * 7) % 40)) for i in range(count)]


def run_direct(model: Any, tokenizer: Any, prompt: str, tokens: int) -> dict[str, float]:
    import onnxruntime_genai as og

    cpu = time.process_time()
    start = time.perf_counter()
    ids = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    length = len(ids) + tokens
    params.set_search_options(max_length=length, min_length=length, **SAMPLING)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    stream = tokenizer.create_stream()
    first, count = None, 0
    while not generator.is_done():
        generator.generate_next_token()
        piece = stream.decode(int(generator.get_next_tokens()[0]))
        count += 1
        # Like the server, which streams text: the first token that decodes to some text.
        if first is None and piece:
            first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return {"ttft_ms": (first - start) * 1e3, "tokens": count, "tokens_per_s": count / (end - start),
            "cpu_ms_per_token": (time.process_time() - cpu) * 1e3 / count}


def run_served(client: httpx.Client, url: str, prompt: str, tokens: int, server: Any) -> dict[str, float]:
    body = {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "temperature": SAMPLING["temperature"], "top_k": SAMPLING["top_k"], "seed": SAMPLING["random_seed"],
            "stream_options": {"include_usage": True}}
    cpu = sum(server.cpu_times()[:2])
    start = time.perf_counter()
    first = last = None
    count = 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                count = event["usage"]["completion_tokens"]
            if event["choices"] and event["choices"][0]["text"]:
                last = time.perf_counter()
                first = first or last
    assert first is not None and last is not None and count == tokens, (count, tokens)
    return {"ttft_ms": (first - start) * 1e3, "tokens": count, "tokens_per_s": count / (last - start),
            "cpu_ms_per_token": (sum(server.cpu_times()[:2]) - cpu) * 1e3 / count}


def build_package_in_child(root: Path, hidden: int, layers: int) -> Path:
    """Build in a child so torch and transformers never load into the process that times og directly."""
    import subprocess

    code = ("import sys; from pathlib import Path; from tests.serving.tinymodel import build_tiny_package; "
            "build_tiny_package(Path(sys.argv[1]), hidden=int(sys.argv[2]), layers=int(sys.argv[3]))")
    subprocess.run([sys.executable, "-c", code, str(root), str(hidden), str(layers)], check=True,
                   cwd=Path(__file__).resolve().parents[1], capture_output=True)
    return root / "package"


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import onnxruntime_genai as og
    import psutil
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        package = build_package_in_child(work / "model", args.hidden, args.layers)
        config = work / "release.yaml"
        config.write_text(yaml.safe_dump({"serving": {"server": {"workers": 1, "max_output_tokens": args.tokens}}}))
        model = og.Model(str(package / "model"))
        tokenizer = og.Tokenizer(model)
        texts = prompts(args.prompts)
        direct: list[dict[str, float]] = []
        served: list[dict[str, float]] = []
        load_before = os.getloadavg()
        with ServerProcess(str(package), work / "server", config=config) as server, httpx.Client(timeout=120) as client:
            proc = psutil.Process(int(server.info["pid"]))
            for text in texts[:2]:  # warm both paths
                run_direct(model, tokenizer, text, args.tokens)
                run_served(client, server.url, text, args.tokens, proc)
            for _ in range(args.rounds):
                for text in texts:
                    direct.append(run_direct(model, tokenizer, text, args.tokens))
                    served.append(run_served(client, server.url, text, args.tokens, proc))
    summary = {
        name: {"ttft_ms_median": median(rows, "ttft_ms"), "tokens_per_s_median": median(rows, "tokens_per_s"),
               "cpu_ms_per_token_median": median(rows, "cpu_ms_per_token")}
        for name, rows in (("direct", direct), ("served", served))
    }
    d, s = summary["direct"], summary["served"]
    result = {
        "benchmark": "relctl serve vs onnxruntime-genai in-process, concurrency 1",
        "model": {"hidden": args.hidden, "layers": args.layers, "precision": "fp32"},
        "tokens_per_request": args.tokens, "requests_per_path": len(direct), **summary,
        "throughput_overhead_pct": (d["tokens_per_s_median"] / s["tokens_per_s_median"] - 1) * 100,
        "ttft_overhead_ms": s["ttft_ms_median"] - d["ttft_ms_median"],
        "ttft_overhead_pct": (s["ttft_ms_median"] / d["ttft_ms_median"] - 1) * 100,
        # CPU per token is far less sensitive to other load on a shared machine than wall time.
        "cpu_overhead_pct": (s["cpu_ms_per_token_median"] / d["cpu_ms_per_token_median"] - 1) * 100,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
