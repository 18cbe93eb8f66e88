"""Benchmark: an adapter release against a full merged release of the same run, and serving throughput with
1, 4 and 16 LoRA adapters active on one base (vLLM on CPU, the engine that serves adapters beside a base).

1. The example at head_dim 64 (vLLM's CPU attention) is trained (--steps, default 40) and its base released
   as tiny-llm v1 (fp32, no gates); then the same run is released twice, timed end to end: merged
   (`relctl promote RUN --model tiny-llm-merged`: intake, merge, reference, convert, validate, package,
   register) and as an adapter (`relctl promote RUN --onto tiny-llm@production`: base match, intake, export,
   validate as served, register).
2. One vLLM base is started with 16 adapters loaded (the run's LoRA with its B scaled by 1 + i/100: distinct
   adapters of one shape) and driven closed-loop at --concurrency (16) with --requests (96) greedy
   completions of --tokens (16) output tokens, the `model` field cycling over the first N adapters.

    python benchmarks/adapter_release.py [--steps 40] [--requests 96] [--concurrency 16]

Results: benchmarks/results/adapter_release.json. Heavy (several vLLM starts): run once, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RELCTL = str(Path(sys.executable).with_name("relctl"))
OUT = REPO / "benchmarks" / "results" / "adapter_release.json"


def relctl(project: Path, *args: str) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    done = subprocess.run([RELCTL, "--project-dir", str(project), *args, "--json"], capture_output=True, text=True,
                          env=dict(os.environ), timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"relctl {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def scaled(adapter: Path, out: Path, scale: float) -> Path:
    out.mkdir(parents=True)
    shutil.copy2(adapter / "adapter_config.json", out / "adapter_config.json")
    tensors = load_file(adapter / "adapter_model.safetensors")
    save_file({k: (v * scale if "lora_B" in k else v) for k, v in tensors.items()}, out / "adapter_model.safetensors")
    return out


def throughput(url: str, names: list[str], requests: int, concurrency: int, tokens: int) -> dict[str, float]:
    def one(i: int) -> int:
        body = {"model": names[i % len(names)], "prompt": "reverse b d a f ->", "max_tokens": tokens,
                "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        produced = sum(pool.map(one, range(requests)))
    seconds = time.monotonic() - started
    return {"adapters": len(names), "requests": requests, "seconds": round(seconds, 2),
            "output_tokens_per_s": round(produced / seconds, 1), "requests_per_s": round(requests / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    from release.backends import get_backend
    from release.core.server_settings import ServerSettings
    from release.signing.keygen import create_keypair
    from tests.conftest import load_tinyllm, load_train_module

    tinyllm, train = load_tinyllm(), load_train_module()
    with tempfile.TemporaryDirectory(prefix="adapter-bench-") as tmp:
        root = Path(tmp)
        pair = create_keypair(root / "keys")
        os.environ.update(RELCTL_SIGNING_KEY=str(pair.private), RELCTL_TRUSTED_KEYS=str(pair.public))
        project = root / "project"
        project.mkdir()
        (project / "release.yaml").write_text("model: tiny-llm\nconvert:\n  backend: vllm\n  precision: fp32\n")
        result = tinyllm.train_tiny_llm(root / "trained", tinyllm.every_engine(base_steps=args.steps,
                                                                              lora_steps=args.steps))
        base = root / "base"
        shutil.copytree(result.data_dir, base, ignore=shutil.ignore_patterns("adapter_*"))
        base_run = train.log_run(replace(result, checkpoint_dir=base / "checkpoint", data_dir=base), project)
        run = train.log_run(result, project, experiment="support")
        base_s, _ = relctl(project, "promote", base_run)
        merged_s, merged = relctl(project, "promote", run, "--model", "tiny-llm-merged")
        adapter_s, adapter = relctl(project, "promote", run, "--onto", "tiny-llm@production")
        # Serving: one base, 16 adapters loaded at start.
        backend = get_backend("vllm")
        model_dir = next((project / ".relctl").rglob("package/model/config.json")).parent
        ckpt = result.checkpoint_dir
        folders = {f"a{i}": scaled(ckpt, root / "adapters" / f"a{i}", 1 + i / 100) for i in range(16)}
        runner = backend.open_adapter_runner(model_dir, ServerSettings(), folders)
        try:
            url = runner.engine.url  # type: ignore[attr-defined]
            rows = [throughput(url, list(folders)[:n], args.requests, args.concurrency, args.tokens)
                    for n in (1, 4, 16)]
        finally:
            runner.close()
    record = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "model": "tiny-llm every_engine (hidden 256, head_dim 64), fp32 on vLLM CPU",
        "release_seconds": {"base": round(base_s, 1), "merged_release_of_the_run": round(merged_s, 1),
                            "adapter_release_of_the_run": round(adapter_s, 1),
                            "adapter_share_of_merged": round(adapter_s / merged_s, 3)},
        "adapter_stages_s": adapter.get("seconds", {}),
        "merged_validation": merged.get("validation", {}).get("metrics", {}),
        "serving": rows,
        "note": "closed loop at the given concurrency, greedy, ignore_eos; the engine's /v1/completions directly "
                "(relctl serve in front adds its per-request overhead: benchmarks/server_overhead.py)",
    }
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
