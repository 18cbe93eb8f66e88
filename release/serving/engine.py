"""The model behind the server: one onnxruntime-genai model, a fixed pool of generator threads and
admission control in front of it.

Generation is blocking C++ work, so each request runs in a worker thread and hands tokens back to the
event loop through an asyncio queue. Admission is decided before any work is queued: at most
`workers + queue_size` requests are admitted; the rest are refused at once (429) instead of piling up.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.errors import InputError
from release.runtime import open_tokenizer
from release.serving.protocol import GenerationParams, ModelLimits
from release.serving.settings import ServerSettings

log = logging.getLogger("relctl.serve")

FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass(frozen=True)
class Finished:
    """The last event of a generation. reason: stop, length, timeout, cancelled or error (`error` says what
    failed: a server fault, since every request parameter is checked before generation starts)."""

    reason: str
    output_tokens: int
    queue_s: float
    error: str | None = None


@dataclass
class Job:
    prompt_ids: list[int]
    params: GenerationParams
    deadline: float  # time.monotonic() value; queue wait counts against it
    loop: asyncio.AbstractEventLoop
    rid: str
    events: asyncio.Queue[str | Finished] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    admitted: float = field(default_factory=time.monotonic)

    def emit(self, event: str | Finished) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Engine:
    """A loaded model: tokenizer, chat template, limits and the worker pool."""

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
        self.model = og.Model(str(model_dir))
        # Like training: onnxruntime-genai leaves out BOS unless special tokens are switched on.
        self.tokenizer = open_tokenizer(self.model)
        self.load_time_s = time.perf_counter() - started
        self.eos_ids = frozenset(int(t) for t in self.tokenizer.eos_token_ids)
        self.chat_template = read_chat_template(model_dir)
        self._pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="relctl-gen")
        self._admitted = 0
        self._running = 0
        self._lock = threading.Lock()
        # Exponentially weighted mean service time, for Retry-After.
        self._service_s = 1.0

    # -- admission ---------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._admitted

    @property
    def queue_depth(self) -> int:
        with self._lock:
            return max(0, self._admitted - self._running)

    def try_admit(self) -> bool:
        """Reserve a slot (called on the event loop thread only); False: the queue is full."""
        if self._admitted >= self.settings.workers + self.settings.queue_size:
            return False
        self._admitted += 1
        return True

    def release(self) -> None:
        self._admitted -= 1

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: the waiting requests' expected service time."""
        waiting = self.queue_depth + 1
        return max(1, math.ceil(waiting * self._service_s / self.settings.workers))

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
                _emit_text(job, stops.flush())
                return "stop", count
            count += 1
            text, stopped = stops.feed(stream.decode(token))
            _emit_text(job, text)
            if stopped:
                return "stop", count
        _emit_text(job, stops.flush())
        return "length", count

    def _search_params(self, job: Job) -> Any:
        params = job.params
        max_length = len(job.prompt_ids) + params.max_tokens
        options: dict[str, Any] = {"max_length": max_length}
        if params.ignore_eos:
            options["min_length"] = max_length
        if params.temperature > 0:
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
        self._pool.shutdown(wait=True, cancel_futures=True)


def _emit_text(job: Job, text: str) -> None:
    if text:
        job.emit(text)


class StopMatcher:
    """Holds back text that could be the start of a stop string, so a stop string is never streamed."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was reached."""
        if not self.stops:
            return piece, False
        self.pending += piece
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self.pending[: min(hits)]
            self.pending = ""
            return out, True
        keep = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def read_chat_template(model_dir: Path) -> str:
    """The tokenizer's chat template, or a plain `role: content` one for models that have none."""
    path = model_dir / "tokenizer_config.json"
    if path.is_file():
        template = json.loads(path.read_text()).get("chat_template")
        if isinstance(template, str) and template:
            return template
    return FALLBACK_CHAT_TEMPLATE
