"""Measured memory and cold start, each in a fresh worker process (release/memory/worker.py).

cpu:  RSS growth over the loaded-model baseline while one batch of `concurrency` sequences runs to
      `context` tokens; on cpu the KV cache lives in host memory, so this is the KV + workspace part of
      the estimate. Untouched pages are not resident, so the batch must really fill its context (a
      prefill of context - 1 tokens, or a short prompt decoded to the end) to be comparable.
cuda: the device's used memory over its reading before the load (nvidia-ml-py), after checking that the
      CUDA provider is the one the session actually uses.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.core.errors import StageFailed


def run_worker(args: list[str], timeout_s: float = 600.0) -> dict[str, Any]:
    """Run `python -m release.memory.worker ARGS` and return its JSON line; StageFailed when it fails."""
    cmd = [sys.executable, "-m", "release.memory.worker", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StageFailed(f"memory worker timed out after {timeout_s:.0f} s", hint="measure a smaller plan") from exc
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise StageFailed(f"memory worker failed (exit {done.returncode}): {tail}",
                          hint="run `python -m release.memory.worker` by hand to see the full error")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure_run(model_dir: Path, concurrency: int, context: int, prompt_tokens: int | None = None,
                provider: str = "cpu") -> dict[str, Any]:
    """Memory growth of one full batch: prefill `prompt_tokens` (default context - 1), decode to `context`."""
    prompt = min(prompt_tokens or context - 1, context - 1)
    steps = context - prompt
    return run_worker(["measure", str(model_dir), "--provider", provider, "--batch", str(concurrency),
                       "--max-length", str(context), "--prompt", str(prompt), "--steps", str(steps)])


@dataclass(frozen=True)
class ColdStart:
    """Median load time and time to first token over `repeats` fresh processes."""

    load_s: float
    ttft_s: float
    repeats: int
    samples: list[dict[str, float]]

    @property
    def total_s(self) -> float:
        return self.load_s + self.ttft_s

    def to_dict(self) -> dict[str, Any]:
        return {"load_s": self.load_s, "ttft_s": self.ttft_s, "total_s": self.total_s, "repeats": self.repeats,
                "samples": self.samples}


def measure_cold_starts(model_dirs: list[Path], repeats: int = 3, provider: str = "cpu",
                        prompt_tokens: int = 8) -> list[ColdStart]:
    """Cold start of each folder, interleaved (a, b, a, b, ...) so machine load drifts hit all alike."""
    samples: list[list[dict[str, float]]] = [[] for _ in model_dirs]
    for _ in range(repeats):
        for i, model_dir in enumerate(model_dirs):
            out = run_worker(["cold-start", str(model_dir), "--provider", provider, "--prompt", str(prompt_tokens)])
            samples[i].append({"load_s": float(out["load_s"]), "ttft_s": float(out["ttft_s"])})
    return [ColdStart(statistics.median(s["load_s"] for s in rows), statistics.median(s["ttft_s"] for s in rows),
                      repeats, rows) for rows in samples]
