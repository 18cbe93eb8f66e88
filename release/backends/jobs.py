"""What a backend's Runner exchanges with relctl's server, declared with the contract so that an engine's package
imports nothing from release.serving: the checked request (GenerationParams), what the model can honour
(ModelLimits), a Job (one admitted request) and its events (text pieces, then one Finished), and the
stop-string matching every generation path shares."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GenerationParams:
    """What the engine needs from a request, checked against the server's limits."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    # OpenAI completions' `logprobs` (top-k alternatives per token; None: no log-probabilities) and `echo`
    # (the prompt's tokens scored too). A scored request runs on the runner's own token loop.
    logprobs: int | None = None
    echo: bool = False

    @property
    def scored(self) -> bool:
        return self.logprobs is not None


@dataclass(frozen=True)
class ModelLimits:
    """What the loaded model can honour (its vocabulary and context, from the engine's own config)."""

    vocab_size: int
    context_length: int



def sampled(params: GenerationParams) -> bool:
    """Whether a request samples, on both generation paths. onnxruntime-genai keeps temperature and top_p
    in float32; its Engine refuses sampling options that select the top token anyway (top_k 1 with a
    temperature: "contradict it") and its Generator samples from top_k when top_p is 0 in float32. So
    every request that can only ever get the most likely token (no temperature, top_k 1, or a top_p or
    temperature that is 0 in float32) runs greedily: the tokens it asked for, on either path."""
    return bool(float(np.float32(params.temperature)) > 0.0 and params.top_k != 1
                and float(np.float32(params.top_p)) > 0.0)


@dataclass(frozen=True)
class Finished:
    """The last event of a generation. reason: stop, length, timeout, cancelled or error (`error` says what
    failed: a server fault, since every request parameter is checked before generation starts)."""

    reason: str
    output_tokens: int
    queue_s: float
    error: str | None = None


@dataclass(frozen=True)
class TokenScore:
    """One token's log-probability under the model (None: a sequence's first token, which nothing predicts)
    and the `top` k most likely tokens at its position, (token id, log-probability), most likely first."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] | None


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
    # The engine's name of the LoRA adapter to run with (an AdapterRunner's load_adapter name); None: the base.
    adapter: str | None = None
    # Filled by a ScoringRunner's token loop when params.scored, read once the job has finished.
    prompt_scores: list[TokenScore] = field(default_factory=list)
    output_scores: list[TokenScore] = field(default_factory=list)
    # Called once when the engine is done with the job (its Finished event is sent, on whichever path and
    # thread): what the request holds for its whole run, e.g. a lease on its adapter, is given back then,
    # even when nobody reads the events any more (the client left, the request timed out).
    on_end: Callable[[], None] | None = None

    def emit(self, event: str | Finished) -> None:
        if isinstance(event, Finished):
            self.end()
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def end(self) -> None:
        """Run `on_end` once (idempotent: a job may be ended by its Finished and by its submitter's failure)."""
        callback, self.on_end = self.on_end, None
        if callback is not None:
            callback()


def deliver(events: list[tuple[Job, str | Finished]]) -> None:
    """On the event loop: hand a batch of events to their jobs, in order (one wake-up for many tokens)."""
    for job, event in events:
        if isinstance(event, Finished):
            job.end()
        job.events.put_nowait(event)


def emit_text(job: Job, text: str) -> None:
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
