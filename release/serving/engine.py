"""The model behind the server: a backend's runner (release/backends/), admission control in front of it,
and two ways to generate:

- batched: the runner's batching engine (a `BatchEngine`: the engine's own continuous batching), up to
  `max_batch_size` requests per model step;
- a fixed pool of generator threads running the runner's token loop (batching off, models the batching
  engine cannot serve, requests with a `seed`, which a static batch cannot honour per request, and requests
  for `logprobs`, which the runner's own loop scores).

Generation is blocking native work, so it never runs on the event loop; tokens come back through an asyncio
queue per request. Admission is decided before any work is queued: at most `slots + queue_size`
requests are admitted (slots: the batch size or the workers); the rest are refused at once (429).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from release.backends import backend_of
from release.backends.base import Backend, LogprobSupport, Runner, ScoringRunner
from release.backends.jobs import Finished, GenerationParams, Job, StopMatcher
from release.core.package import PackageManifest
from release.core.server_settings import ServerSettings

__all__ = ["Engine", "Finished", "StopMatcher", "open_engine"]

log = logging.getLogger("relctl.serve")


def open_engine(package: PackageManifest, settings: ServerSettings,
                adapters: Mapping[str, Path] | None = None) -> Engine:
    """The package's model loaded by its own backend, behind relctl's admission and thread pool. `adapters`
    (engine name: folder; may be empty): LoRA serving on, those loaded (release/serving/adapters.py)."""
    backend: Backend = backend_of(package)
    settings = admitted_settings(backend, settings)
    started = time.perf_counter()
    if adapters is not None:
        runner: Runner = backend.open_adapter_runner(package.model_dir, settings, adapters)
    else:
        runner = backend.open_runner(package.model_dir, settings)
    return Engine(runner, settings, time.perf_counter() - started, backend.id, backend.logprobs)


def admitted_settings(backend: Backend, settings: ServerSettings) -> ServerSettings:
    """`settings` with `workers` raised to what an engine that schedules itself runs at once: relctl's queue
    in front must never cap the engine below its own scheduler (it would measure relctl, not the engine)."""
    limit = backend.admission_limit(settings)
    if limit is None or limit <= settings.workers:
        return settings
    return settings.model_copy(update={"workers": limit})


class Engine:
    """A loaded model: tokenizer, chat template, limits, admission, the batching engine and the worker pool."""

    def __init__(self, runner: Runner, settings: ServerSettings, load_time_s: float = 0.0, backend_id: str = "",
                 logprobs: LogprobSupport | None = None) -> None:
        self.runner = runner
        self.backend_id = backend_id
        # What the backend declared, and only when its runner can turn the scored ids back into text.
        self.logprobs = logprobs if logprobs is not None and isinstance(runner, ScoringRunner) else LogprobSupport()
        self.scorer: ScoringRunner | None = runner if isinstance(runner, ScoringRunner) else None
        self.settings = settings
        self.limits = runner.limits
        self.context_length = runner.limits.context_length
        self.batch = runner.batch
        self.batching_note = runner.batching_note
        self.load_time_s = load_time_s
        self._pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="relctl-gen")
        self.slots = self.batch.max_batch_size if self.batch else settings.workers
        self._admitted = 0
        self._running = 0
        self._lock = threading.Lock()
        # Exponentially weighted mean service time of the thread pool, for Retry-After.
        self._service_s = 1.0

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
        return self.runner.encode(text)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.runner.render_chat(messages)

    # -- generation -----------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: GenerationParams, deadline: float, rid: str = "",
                       on_job: Callable[[Job], None] | None = None, adapter: str | None = None,
                       on_end: Callable[[], None] | None = None) -> AsyncGenerator[str | Finished, None]:
        """Text pieces as they are produced, then one Finished. The caller must hold an admitted slot.
        `on_job` receives the Job before it runs (a scored request reads its scores from it when finished).
        `adapter`: the engine's name of a loaded LoRA adapter to generate with. `on_end`: called once when
        the engine is done with the request (Job.on_end), from its first step on, however it ends."""
        job = Job(prompt_ids, params, deadline, asyncio.get_running_loop(), rid, adapter=adapter, on_end=on_end)
        try:
            if on_job is not None:
                on_job(job)
            batch = self.batch
            # An adapter's job runs on the thread pool: an engine's batch serves its base (an in-process engine's
            # batcher takes no per-request adapter; an engine server's runner batches on its side, no batch here).
            if batch is not None and batch.healthy and params.seed is None and not params.scored and adapter is None:
                batch.submit(job)
            else:
                self._pool.submit(self._run, job)
        except BaseException:
            job.end()  # never queued: nothing else will end it
            raise
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
            reason, count = self.runner.decode_loop(job)
            job.emit(Finished(reason, count, started - job.admitted))
        except Exception as exc:  # whatever fails, the request must end now, not at its timeout
            log.exception("request %s: generation failed", job.rid)
            job.emit(Finished("error", 0, started - job.admitted, f"{type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self._running -= 1
                self._service_s = 0.8 * self._service_s + 0.2 * (time.monotonic() - started)

    def close(self) -> None:
        """Wait for running generations (graceful shutdown has already drained the requests)."""
        self.runner.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

