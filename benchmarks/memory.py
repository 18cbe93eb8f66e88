"""Benchmark: relctl's memory estimate against a CPU measurement, and against accelerate's weights-only figure.

For each synthetic Llama shape (random weights; `tiny` and `larger`) and precision (fp32, int8, int4 on the
cpu provider), the checkpoint is converted with onnxruntime-genai's builder, then for each concurrency x
context a fresh worker process (release/memory/worker.py) loads it and runs one batch to the end of the
context, reading RSS:
  weights   relctl's builder-layout figure from config.json vs the package's initializer bytes (exact)
            vs accelerate's method (parameter count x dtype bytes: calculate_maximum_sizes on an
            init_empty_weights model, divided as `accelerate estimate-memory` does: fp16 /2, int8 /4, int4 /8)
  run       RSS growth over the loaded-model baseline (peak while the batch runs) vs relctl's KV cache +
            workspace for the same concurrency, context and prefill (on cpu the KV lives in host memory)
            mode prefill: a prompt of context-1 tokens for every sequence, then one token
            mode decode:  a 16-token prompt decoded to the end of the context
  overhead  RSS after load minus RSS before load minus the weights: relctl's cpu runtime-overhead constant
Error per row = (estimate - measured) / measured. Results: benchmarks/results/memory.json.

    python benchmarks/memory.py            # both shapes, every row (~6 min on 2 shared cores)
    python benchmarks/memory.py --quick    # tiny shape only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from release.backends.onnxruntime_genai.plan import ModelSpec, breakdown
from release.backends.package_facts import read_package
from release.backends.planning import Target
from release.backends.shape import Precision, builder_weights_bytes, parameter_count, shape_from_config
from release.memory.measure import measure_run

RESULTS = Path(__file__).parent / "results" / "memory.json"
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "memory" / "fixtures"
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 320},
    "larger": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 2, "intermediate": 1408, "vocab": 8000},
}
PRECISIONS: tuple[Precision, ...] = ("fp32", "int8", "int4")
PREFILL_ROWS = [(b, n) for n in (256, 1024) for b in (1, 4, 8)]
DECODE_ROWS = [(1, 256), (8, 256)]
ACCELERATE_DIVISOR = {"fp32": 1, "fp16": 2, "int8": 4, "int4": 8}


def write_checkpoint(out: Path, shape: dict[str, int]) -> Path:
    """A random Llama of `shape` with the tiny BPE tokenizer (generation here feeds token ids directly)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.serving.tinymodel import build_hf_model

    tok_dir = build_hf_model(out / "tok")
    hf = out / "hf"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                         intermediate_size=shape["intermediate"], max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(hf, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok_dir / name).is_file():
            shutil.copy2(tok_dir / name, hf / name)
    return hf


def build(hf: Path, out: Path, precision: str) -> Path:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", precision,
           "-e", "cpu", "-c", str(out.with_name(out.name + ".cache"))]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"builder failed for {precision}: {done.stderr[-1500:]}")
    shutil.copy2(hf / "config.json", out / "config.json")
    return out


def accelerate_weights(config_path: Path, precision: str) -> int | None:
    """accelerate's estimate-memory figure, computed locally (the command itself needs the hub)."""
    try:
        from accelerate import init_empty_weights
        from accelerate.utils import calculate_maximum_sizes
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return None
    config = AutoConfig.from_pretrained(str(config_path.parent if config_path.name == "config.json" else config_path))
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype="float32")
    total, _largest = calculate_maximum_sizes(model)
    return int(total // ACCELERATE_DIVISOR[precision])


def measure_rows(name: str, pkg: Path, precision: Precision, quick: bool) -> list[dict[str, Any]]:
    facts = read_package(pkg)
    spec = ModelSpec(shape_from_config(facts.config), precision, facts.weights_bytes, facts.kv_dtype_bytes, "package")
    rows = []
    plans = [("prefill", b, n, None) for b, n in PREFILL_ROWS] + [("decode", b, n, 16) for b, n in DECODE_ROWS]
    for mode, batch, context, prompt in plans[:3] if quick else plans:
        measured = measure_run(facts.model_dir, batch, context, prompt_tokens=prompt)
        prefill = min(prompt or context - 1, context - 1)
        plan = breakdown(spec, Target(memory_gib=64, concurrency=batch, context=context, provider="cpu",
                                      prefill_tokens=prefill, rollout_overlap=False))
        estimate = plan.kv_cache + plan.workspace
        growth = int(measured["growth"])
        rows.append({"shape": name, "precision": precision, "mode": mode, "concurrency": batch, "context": context,
                     "prefill_tokens": prefill, "kv_cache": plan.kv_cache, "workspace": plan.workspace,
                     "estimate": estimate, "measured": growth, "error": round((estimate - growth) / growth, 4),
                     "load_overhead": int(measured["rss_loaded"]) - int(measured["rss_start"]) - facts.weights_bytes,
                     "load_s": round(float(measured["load_s"]), 4), "ttft_s": round(float(measured["ttft_s"]), 4)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def weights_row(name: str, hf: Path, pkg: Path, precision: Precision) -> dict[str, Any]:
    shape = shape_from_config(json.loads((hf / "config.json").read_text()))
    actual = read_package(pkg).weights_bytes
    return {"shape": name, "precision": precision, "parameters": parameter_count(shape),
            "relctl": builder_weights_bytes(shape, precision, "cpu"), "initializers": actual,
            "accelerate": accelerate_weights(hf / "config.json", precision)}


def published_rows() -> list[dict[str, Any]]:
    """relctl's builder layout vs accelerate's method for the published 7-8B configs (cuda: fp16 io)."""
    rows = []
    for path in sorted(FIXTURES.glob("*.json")):
        shape = shape_from_config(json.loads(path.read_text()))
        for precision in ("fp16", "int8", "int4"):
            rows.append({"config": path.stem, "precision": precision, "parameters": parameter_count(shape),
                         "relctl_cuda": builder_weights_bytes(shape, precision, "cuda"),
                         "accelerate": _accelerate_fixture(path, precision)})
    return rows


def _accelerate_fixture(path: Path, precision: str) -> int | None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(path.read_text())
        return accelerate_weights(Path(tmp) / "config.json", precision)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny shape, three rows per precision")
    args = parser.parse_args()
    started = time.time()
    runs: list[dict[str, Any]] = []
    weights: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            if args.quick and name != "tiny":
                continue
            hf = write_checkpoint(Path(tmp) / name, shape)
            for precision in PRECISIONS:
                pkg = build(hf, Path(tmp) / name / precision, precision)
                weights.append(weights_row(name, hf, pkg, precision))
                runs.extend(measure_rows(name, pkg, precision, args.quick))
    errors = [abs(r["error"]) for r in runs]
    overheads = [r["load_overhead"] for r in runs if r["precision"] == "fp32"]
    result = {
        "benchmark": "memory",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "wall_s": round(time.time() - started, 1),
        "summary": {"rows": len(runs), "max_abs_error": max(errors), "median_abs_error": statistics.median(errors),
                    "p90_abs_error": sorted(errors)[int(0.9 * (len(errors) - 1))],
                    "cpu_load_overhead_median_fp32": statistics.median(overheads) if overheads else None},
        "weights": weights,
        "published": published_rows(),
        "runs": runs,
    }
    if not args.quick:
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
