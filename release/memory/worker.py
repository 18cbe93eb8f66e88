"""Measurements that need a process of their own (`python -m release.memory.worker MODE MODEL_DIR ...`):
the RSS (cpu) or device memory (cuda) a loaded model grows by when it runs a full batch, and cold start
(load time, time to first token). Prints one JSON object on stdout.

A fresh process per measurement: the allocator state and page cache of an earlier load must not count.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import psutil

from release.backends import backend_for_folder


class PeakSampler:
    """Samples a reading every `interval_s` on a thread, so transient peaks inside one call are seen."""

    def __init__(self, read: Callable[[], int], interval_s: float = 0.002) -> None:
        self.read = read
        self.peak = read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), daemon=True)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.peak = max(self.peak, self.read())

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.read())


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of this process's RSS to its current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int | None:
    """The kernel's high-water mark (VmHWM): a peak no sampler can miss, even while a call holds the GIL."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _release_free_heap() -> None:
    # Loading frees its read buffers into malloc's heap, where they stay resident; a later allocation that
    # reuses them would not show as growth. glibc's malloc_trim hands them back first (no-op elsewhere).
    name = ctypes.util.find_library("c")
    if name:
        trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
        if trim is not None:
            trim(0)


def _device_used() -> Callable[[], int]:
    """Used memory of the visible device (nvidia-ml-py). The device's total, not this pid's: a container's pid
    namespace hides the pid from the driver, and before the CUDA context exists there is no entry to read.
    The caller subtracts the reading taken before the load, so on a device nothing else uses it is ours."""
    import pynvml  # noqa: PLC0415 - nvidia-ml-py is in the gpu extra only

    pynvml.nvmlInit()
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)

    def read() -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

    return read


def measure(model_dir: Path, provider: str, batch: int, max_length: int, prompt: int, steps: int) -> dict[str, Any]:
    """Memory before load, after load, and at the peak of one full batch (cpu: RSS; cuda: the device's used memory)."""
    backend = backend_for_folder(model_dir)
    backend.check_environment(model_dir, provider)  # the device a session really runs on, not the available list
    read = _rss if provider == "cpu" else _device_used()
    started = _rss()
    device_start = read()
    t0 = time.perf_counter()
    probe = backend.batch_probe(model_dir, provider)
    if probe is None:
        raise SystemExit(f"the {backend.id} backend cannot be measured in-process on {provider}")
    load_s = time.perf_counter() - t0
    _release_free_heap()
    loaded = read()
    rss_loaded = _rss()
    kernel_peak = provider == "cpu" and _reset_peak_rss()
    with PeakSampler(read) as sampler:
        ttft = probe.run(batch, max_length, prompt, steps)
    peak = max(sampler.peak, (_peak_rss() or 0) if kernel_peak else 0)
    return {"provider": provider, "batch": batch, "max_length": max_length, "prompt_tokens": prompt,
            "rss_start": started, "rss_loaded": rss_loaded, "start": device_start, "loaded": loaded,
            "peak": peak, "sampled_peak": sampler.peak, "growth": peak - loaded, "load_s": load_s,
            "ttft_s": ttft, "peak_source": "VmHWM" if kernel_peak else "sampled"}


def cold_start(model_dir: Path, provider: str, prompt: int) -> dict[str, Any]:
    """Load time of the model and time to the first token of its first request (batch 1), through the
    backend that built the folder, whichever engine that is."""
    backend = backend_for_folder(model_dir)
    t0 = time.perf_counter()
    model = backend.load(model_dir, provider)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    model.generate_ids([(i % 7) + 3 for i in range(prompt)], 1)
    return {"provider": provider, "backend": backend.id, "load_s": load_s, "ttft_s": time.perf_counter() - t1}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m release.memory.worker")
    parser.add_argument("mode", choices=["measure", "cold-start"])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if args.mode == "measure":
        out = measure(args.model_dir, args.provider, args.batch, args.max_length, args.prompt, args.steps)
    else:
        out = cold_start(args.model_dir, args.provider, args.prompt)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
