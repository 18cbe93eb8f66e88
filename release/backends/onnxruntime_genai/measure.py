"""Measuring a genai folder's memory: one batched generation at a planned batch and context, on the provider
asked for. The memory plan's worker (release/memory/worker.py) and its CUDA measurement call this through the
backend (Backend.batch_probe), so the engine is loaded here and nowhere else."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.onnxruntime_genai.model import kv_floor, read_genai_config


class GenaiBatchProbe:
    """A loaded og.Model that runs one batch of `batch` prompts of `prompt` tokens for `steps` tokens."""

    def __init__(self, model_dir: Path, provider: str) -> None:
        import onnxruntime_genai as og  # noqa: PLC0415 - native libraries, only when a measurement runs

        self._og = og
        config = og.Config(str(model_dir))
        config.clear_providers()
        if provider != "cpu":
            config.append_provider(provider)
        self.model: Any = og.Model(config)
        self.kv_floor = kv_floor(read_genai_config(model_dir))

    def run(self, batch: int, max_length: int, prompt: int, steps: int) -> float:
        """Prefill the batch, then decode `steps` tokens; the seconds to the first token."""
        og = self._og
        params = og.GeneratorParams(self.model)
        # The KV cache is allocated for max_length up front: the planned context.
        # (a sliding-window model runs with no less than its window, whatever the plan's context).
        params.set_search_options(max_length=max(max_length, self.kv_floor), do_sample=False, batch_size=batch)
        started = time.perf_counter()
        generator = og.Generator(self.model, params)
        ids = (np.arange(batch * prompt, dtype=np.int32).reshape(batch, prompt) % 7) + 3
        generator.append_tokens(ids)
        generator.generate_next_token()
        first = time.perf_counter() - started
        for _ in range(steps - 1):
            if generator.is_done():
                break
            generator.generate_next_token()
        del generator
        return first

    def close(self) -> None:
        del self.model


def cuda_available() -> bool:
    import onnxruntime_genai as og  # noqa: PLC0415 - native libraries

    return bool(og.is_cuda_available())
