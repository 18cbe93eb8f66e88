"""The model behind the server: one onnxruntime-genai model, admission control in front of it, and two
ways to generate:

- batched (serving.server.batching auto|on): onnxruntime-genai's `og.Engine` on one driver thread
  (release.serving.batching), up to `max_batch_size` requests per model step;
- a fixed pool of generator threads (batching off, models the Engine cannot serve, and requests with a
  `seed`, which the Engine's static scheduler cannot honour per request).

Generation is blocking C++ work, so it never runs on the event loop; tokens come back through an asyncio
queue per request. Admission is decided before any work is queued: at most `slots + queue_size`
requests are admitted (slots: the batch size or the workers); the rest are refused at once (429).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from release.errors import InputError
from release.runtime import open_tokenizer
from release.serving.batching import BatchEngine
from release.serving.jobs import Finished, Job, StopMatcher, emit_text, sampled
from release.serving.protocol import GenerationParams, ModelLimits
from release.serving.settings import ServerSettings

__all__ = ["Engine", "Finished", "StopMatcher"]

log = logging.getLogger("relctl.serve")

FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class Engine:
    """A loaded model: tokenizer, chat template, limits, admission, the batching engine and the worker pool."""

    def __init__(self, model_dir: Path, settings: ServerSettings) -> None:
        import onnxruntime_genai as og  # noqa: PLC0415 - loaded with a model, not by `relctl bench`

        self._og = og
        self.settings = settings
        config_path = model_dir / "genai_config.json"
        if not config_path.is_file():
            raise InputError(f"{model_dir}: genai_config.json missing", hint="serve a relctl package folder")
        runtime = json.loads(config_path.read_text())
        self.context_length = int(runtime["model"]["context_length"])
        self.limits = ModelLimits(vocab_size=int(runtime["model"]["vocab_size"]), context_length=self.context_length)
        started = time.perf_counter()
        config = og.Config(str(model_dir))
        if settings.batching != "off":
            config.overlay(json.dumps({"engine": {"static_batching": {"max_batch_size": settings.max_batch_size}}}))
        if settings.intra_op_threads is not None:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": settings.intra_op_threads}}}}))
        self.model = og.Model(config)
        # Like training: onnxruntime-genai leaves out BOS unless special tokens are switched on.
        self.tokenizer = open_tokenizer(self.model)
        self.eos_ids = frozenset(int(t) for t in self.tokenizer.eos_token_ids)
        self.batch, self.batching_note = self._start_batching(model_dir)
        self.load_time_s = time.perf_counter() - started
        self.chat_template = read_chat_template(model_dir)
        self._pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="relctl-gen")
        self.slots = self.batch.max_batch_size if self.batch else settings.workers
        self._admitted = 0
        self._running = 0
        self._lock = threading.Lock()
        # Exponentially weighted mean service time of the thread pool, for Retry-After.
        self._service_s = 1.0

    def _start_batching(self, model_dir: Path) -> tuple[BatchEngine | None, str]:
        mode = self.settings.batching
        if mode == "off":
            return None, "off (serving.server.batching)"
        try:
            batch = BatchEngine(self._og, self.model, self.tokenizer, self.eos_ids, self.settings.max_batch_size,
                                gather_s=self.settings.batch_gather_ms / 1e3)
        except Exception as exc:  # the Engine refuses models it cannot schedule (model-managed KV cache...)
            if mode == "on":
                raise InputError(f"{model_dir.parent.name}: batching is on, but onnxruntime-genai's Engine cannot "
                                 f"serve this model: {exc}", hint="set serving.server.batching to auto or off") from exc
            log.info("batching unavailable, serving with %d generator threads: %s", self.settings.workers, exc)
            return None, f"unavailable: {exc}"
        if batch.max_batch_size < batch.requested_batch_size:
            note = (f"on, {batch.max_batch_size} requests per step (onnxruntime-genai's scheduler, measured at "
                    f"load; serving.server.max_batch_size is {batch.requested_batch_size})")
            log.info("batching %s", note)
            return batch, note
        return batch, "on"

    @property
    def batching(self) -> dict[str, Any]:
        """What /health, /v1/models and /metrics say about batching."""
        batch = self.batch
        if batch is None:
            return {"mode": "threads", "max_batch_size": 1, "workers": self.settings.workers,
                    "note": self.batching_note}
        steps = batch.stats.steps
        return {"mode": "engine", "max_batch_size": batch.max_batch_size, "healthy": batch.healthy,
                "resident": batch.stats.resident, "steps": steps,
                "mean_batch": round(batch.stats.batched_tokens / steps, 3) if steps else 0.0,
                "widest_step": batch.stats.widest, "note": self.batching_note}

    # -- admission ---------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._admitted

    @property
    def queue_depth(self) -> int:
        resident = self.batch.stats.resident if self.batch else 0
        with self._lock:
            return max(0, self._admitted - self._running - resident)

    def try_admit(self) -> bool:
        """Reserve a slot (called on the event loop thread only); False: the queue is full."""
        if self._admitted >= self.slots + self.settings.queue_size:
            return False
        self._admitted += 1
        return True

    def release(self) -> None:
        self._admitted -= 1

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: the waiting requests' expected service time."""
        waiting = self.queue_depth + 1
        service = self._service_s
        if self.batch is not None and self.batch.stats.services:
            service = sum(self.batch.stats.services) / len(self.batch.stats.services)
        return max(1, math.ceil(waiting * service / self.slots))

    # -- prompts -------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        rendered: str = self.tokenizer.apply_chat_template(
            json.dumps(messages), template_str=self.chat_template, add_generation_prompt=True
        )
        return rendered

    # -- generation -----------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: GenerationParams, deadline: float, rid: str = ""
                       ) -> AsyncGenerator[str | Finished, None]:
        """Text pieces as they are produced, then one Finished. The caller must hold an admitted slot."""
        job = Job(prompt_ids, params, deadline, asyncio.get_running_loop(), rid)
        batch = self.batch
        if batch is not None and batch.healthy and params.seed is None:
            batch.submit(job)
        else:
            self._pool.submit(self._run, job)
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                while True:
                    event = await job.events.get()
                    yield event
                    if isinstance(event, Finished):
                        return
        except TimeoutError:
            yield Finished("timeout", 0, time.monotonic() - job.admitted)
        finally:
            # The client left, the deadline passed or the generation ended: stop the worker either way.
            job.cancel.set()

    def _run(self, job: Job) -> None:
        started = time.monotonic()
        with self._lock:
            self._running += 1
        try:
            if job.cancel.is_set() or started >= job.deadline:
                job.emit(Finished("timeout", 0, started - job.admitted))
                return
            reason, count = self._decode_loop(job)
            job.emit(Finished(reason, count, started - job.admitted))
        except Exception as exc:  # whatever fails, the request must end now, not at its timeout
            log.exception("request %s: generation failed", job.rid)
            job.emit(Finished("error", 0, started - job.admitted, f"{type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self._running -= 1
                self._service_s = 0.8 * self._service_s + 0.2 * (time.monotonic() - started)

    def _decode_loop(self, job: Job) -> tuple[str, int]:
        params = job.params
        generator = self._og.Generator(self.model, self._search_params(job))
        generator.append_tokens(job.prompt_ids)
        stream = self.tokenizer.create_stream()
        stops = StopMatcher(params.stop)
        count = 0
        while not generator.is_done():
            if job.cancel.is_set() or time.monotonic() >= job.deadline:
                return "timeout", count
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in self.eos_ids and not params.ignore_eos:
                emit_text(job, stops.flush())
                return "stop", count
            count += 1
            text, stopped = stops.feed(stream.decode(token))
            emit_text(job, text)
            if stopped:
                return "stop", count
        emit_text(job, stops.flush())
        return "length", count

    def _search_params(self, job: Job) -> Any:
        params = job.params
        max_length = len(job.prompt_ids) + params.max_tokens
        options: dict[str, Any] = {"max_length": max_length}
        if params.ignore_eos:
            options["min_length"] = max_length
        if sampled(params):
            options.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
            if params.seed is not None:
                options["random_seed"] = params.seed
        else:
            options["do_sample"] = False
        search = self._og.GeneratorParams(self.model)
        search.set_search_options(**options)
        return search

    def close(self) -> None:
        """Wait for running generations (graceful shutdown has already drained the requests)."""
        if self.batch is not None:
            self.batch.close()
        self._pool.shutdown(wait=True, cancel_futures=True)


def read_chat_template(model_dir: Path) -> str:
    """The tokenizer's chat template, or a plain `role: content` one for models that have none."""
    path = model_dir / "tokenizer_config.json"
    if path.is_file():
        template = json.loads(path.read_text()).get("chat_template")
        if isinstance(template, str) and template:
            return template
    return FALLBACK_CHAT_TEMPLATE
