"""llama.cpp's memory plan per replica against the measured RSS of llama-server on CPU (the sibling of
benchmarks/vllm_memory.py; issue 27, step 4: memory per replica from the engine's plan, within 15% of RSS).

For two random Llamas (the example's size, hidden 256 over 4 heads, 2 layers, 128 positions; and a wider one,
hidden 512, 4 layers, 256 positions), each precision relctl builds for them (fp16, q8_0) and 1, 4 and 16
slots: the GGUF is built with relctl's own export, llama-server started as `relctl serve` starts it (the
backend's engine_command: --parallel N --kv-unified --ctx-size N x context), every slot given a full-context request
at once (so the weights' pages are read and the compute buffers used), and the RSS of llama-server (psutil)
compared with the plan's per-replica bytes for the same slots and context (Backend.plan: weights + KV pool +
compute buffer + process allowance). Writes benchmarks/results/llama_cpp_memory.json.

    python benchmarks/llama_cpp_memory.py        # about a minute
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from release.backends.llama_cpp import LlamaCppBackend
from release.backends.llama_cpp.server import THREADS_ENV, ServerProcess, log_path
from release.backends.planning import Target
from release.backends.processes import free_port
from tests.serving.tinymodel import WORDS, build_hf_model

RESULTS = Path(__file__).parent / "results" / "llama_cpp_memory.json"
MODELS = {"example-sized": {"hidden": 256, "layers": 2, "context": 128},
          "wider": {"hidden": 512, "layers": 4, "context": 256}}
PRECISIONS = ("fp16", "q8_0")
SLOTS = (1, 4, 16)
TOLERANCE = 0.15
COMPUTE_LINE = re.compile(r"CPU compute buffer size = +([\d.]+) MiB")  # llama-server's own, logged at start


def busy(url: str, slots: int, context: int) -> None:
    """One request per slot at once, each filling its slot's context (the plan's premise: a full-length prompt
    for every sequence): context - 16 prompt tokens, 16 new ones."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(2 * context))
    tokens = httpx.post(url + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    prompt = tokens[: context - 16]

    def one(_: int) -> None:
        httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 16, "ignore_eos": True},
                   timeout=300).raise_for_status()

    with ThreadPoolExecutor(slots) as pool:
        list(pool.map(one, range(slots)))


def measure(package: Path, slots: int, context: int) -> dict[str, Any]:
    backend = LlamaCppBackend()
    target = Target(memory_gib=8, concurrency=slots, context=context, provider="cpu", rollout_overlap=False)
    plan = backend.plan(package, target)
    port = free_port()
    command = backend.engine_command(package / "model", "engine", "127.0.0.1", port, slots=slots)
    with ServerProcess(command, f"http://127.0.0.1:{port}", log_path("memory", port)) as server:
        at_start = server.resident_bytes()
        busy(server.url, slots, context)
        time.sleep(0.2)
        resident = server.resident_bytes()
        logged = COMPUTE_LINE.search(server.log_path.read_text(errors="replace"))
    assert resident is not None and at_start is not None
    return {"slots": slots, "context": context, "planned_per_replica_bytes": plan.per_replica_bytes,
            "resident_bytes": resident, "resident_at_start_bytes": at_start,
            "relative_error": round((plan.per_replica_bytes - resident) / resident, 4),
            "within_tolerance": abs(plan.per_replica_bytes - resident) <= TOLERANCE * resident,
            "weights_bytes": plan.weights_bytes, "kv_pool_bytes": plan.kv_cache_bytes,
            "compute_bytes": plan.activations_bytes, "overhead_bytes": plan.overhead_bytes,
            "kv_cells": plan.kv_capacity_tokens,
            "logged_compute_buffer_bytes": None if logged is None else int(float(logged[1]) * 2**20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    os.environ.setdefault(THREADS_ENV, "1")  # see benchmarks/router_capacity.py: ggml's spinning threads
    backend = LlamaCppBackend()
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in MODELS.items():
            checkpoint = build_hf_model(Path(tmp) / name / "hf", hidden=shape["hidden"], layers=shape["layers"],
                                        context=shape["context"])
            for precision in PRECISIONS:
                package = Path(tmp) / name / precision
                (package / "model").mkdir(parents=True)
                (package / "source").mkdir()
                backend.export(checkpoint, package / "model", precision, "cpu", package / "export.log")
                shutil.copy2(checkpoint / "config.json", package / "source" / "config.json")
                for slots in SLOTS:
                    row = {"model": name, **shape, "precision": precision,
                           **measure(package, slots, shape["context"])}
                    rows.append(row)
                    print(f"{name} {precision} slots {slots}: plan {row['planned_per_replica_bytes'] / 2**20:.1f} "
                          f"MiB, RSS {row['resident_bytes'] / 2**20:.1f} MiB, error {row['relative_error']:+.1%}",
                          flush=True)
    errors = [abs(r["relative_error"]) for r in rows]
    out = {"benchmark": "llama.cpp's planned memory per replica vs llama-server's RSS after one request per slot",
           "tolerance": TOLERANCE, "all_within_tolerance": all(r["within_tolerance"] for r in rows),
           "largest_abs_relative_error": max(errors), "rows": rows,
           "engine_settings": {THREADS_ENV: os.environ[THREADS_ENV]},
           "machine": {"cpus": os.cpu_count(), "shared": "yes (see loadavg)", "loadavg_before": load_before,
                       "loadavg_after": os.getloadavg()},
           "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"largest |error| {max(errors):.1%}; all within {TOLERANCE:.0%}: {out['all_within_tolerance']}")


if __name__ == "__main__":
    main()
