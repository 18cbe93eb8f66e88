"""Batched generation through onnxruntime-genai's `og.Engine`: one driver thread owns the engine, adds
admitted requests as they arrive, steps the batch with `run()` and routes each token event to its Job.

Every Engine call happens on the driver thread (the engine is not documented as thread-safe); the event
loop only queues jobs and sets their cancel flags, which the driver checks before every step. On CPU,
with the KV-cache layout the model builder emits, onnxruntime-genai 0.18 schedules statically: a batch
is formed from the requests waiting when it starts and runs until each of them has finished; requests
arriving meanwhile wait for the next batch (the paged-cache `dynamic_batching` scheduler, which admits
into a running batch, needs a model exported with paged attention). Its static scheduler also steps at
most 4 requests at once whatever `static_batching.max_batch_size` says (a constant in its source, which
the reported capability does not show), so the width is measured at load and the driver itself keeps
the batch within the configured size.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from release.backends.jobs import Finished, Job, StopMatcher, deliver, sampled

log = logging.getLogger("relctl.serve")


@dataclass
class Live:
    """A job whose request is in the engine."""

    job: Job
    request: Any
    turn: int
    stream: Any
    stops: StopMatcher
    started: float
    count: int = 0
    running: bool = False  # in the batch the engine is stepping (it has had a token), not waiting for one
    done: bool = False
    cancelled_for: str | None = None  # timeout or cancelled, once cancel_turn was asked for


@dataclass
class BatchStats:
    steps: int = 0
    batched_tokens: int = 0  # token events summed over steps: mean batch = batched_tokens / steps
    widest: int = 0  # the most token events one step produced
    resident: int = 0
    failures: int = 0
    services: deque[float] = field(default_factory=lambda: deque(maxlen=64))


class BatchEngine:
    """og.Engine behind a thread: `submit(job)` from any thread; `close()` stops the driver."""

    def __init__(self, og: Any, model: Any, tokenizer: Any, eos_ids: frozenset[int], max_batch_size: int,
                 gather_s: float = 0.005) -> None:
        self._og = og
        self.requested_batch_size = max_batch_size
        self._gather_s = gather_s
        self._tokenizer = tokenizer
        self._eos = eos_ids
        self._flags = og.EngineEventFlags
        self._reasons = {og.FinishReason.EOS: "stop", og.FinishReason.STOP_STRING: "stop",
                         og.FinishReason.MAX_GENERATED_TOKENS: "length", og.FinishReason.MAX_SESSION_TOKENS: "length"}
        self._inbox: deque[Job] = deque()
        # Events of one driver turn, handed to the event loop in one wake-up (not one per token).
        self._outbox: list[tuple[Job, str | Finished]] = []
        self._live: dict[int, Live] = {}
        self._wake = threading.Condition()
        self._closing = False
        self.healthy = True
        self.stats = BatchStats()
        self.max_batch_size = 0
        # og.Engine serves only the thread that created it, so the driver thread creates it.
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._own, args=(model,), name="relctl-batch", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def _own(self, model: Any) -> None:
        try:
            self.engine = self._og.Engine(model)
            self._buffer = self.engine.create_event_buffer(max(64, 4 * self.requested_batch_size))
            self.max_batch_size = min(self.requested_batch_size, self._step_width(self.requested_batch_size))
        except Exception as exc:
            self._failure = exc
            return
        finally:
            self._ready.set()
        self._drive()

    def _step_width(self, n: int) -> int:
        """How many requests one engine step really runs when `n` wait: n one-token requests, counted in
        the first step (two model steps of a one-token prompt: negligible next to loading the model)."""
        if n == 1:
            return 1
        requests = []
        for _ in range(n):
            request = self.engine.create_request()
            options = self._og.TurnOptions(request)
            options.set_max_generated_tokens(1)
            options.set_do_sample(False)
            request.begin_turn(np.asarray([0], dtype=np.int32), options)
            requests.append(request)
        widths = [1]
        while self.engine.has_pending_requests():
            widths.append(self._tokens(self.engine.run(self._buffer)))
        for request in requests:
            request.close()
        return max(widths)

    def _tokens(self, events: Any) -> int:
        """Token events in one step's events: the requests that step ran."""
        return sum(1 for event in events if event.flags & self._flags.TOKEN)

    def submit(self, job: Job) -> None:
        with self._wake:
            self._inbox.append(job)
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(30)

    # -- the driver thread ---------------------------------------------------------------------------
    def _drive(self) -> None:
        while True:
            with self._wake:
                while not self._inbox and not self._live and not self._closing:
                    self._wake.wait()
                if self._closing:
                    waiting = list(self._inbox)
                    self._inbox.clear()
                    break
                # Never more in the engine than the batch size: the rest wait here, counted as queued.
                room = max(0, self.max_batch_size - len(self._live))
                arrived = [self._inbox.popleft() for _ in range(min(room, len(self._inbox)))]
            for job in arrived:
                self._begin(job)
            self._check_cancels()
            if self._live and self.healthy and self._step():
                self._flush()
                self._gather()
            self._flush()
        now = time.monotonic()
        for job in waiting:
            self._send(job, Finished("cancelled", 0, now - job.admitted))
        for live in list(self._live.values()):
            self._end(live, Finished("cancelled", live.count, live.started - live.job.admitted))
        self._flush()

    def _gather(self) -> None:
        """A batch has just ended and the next one forms at the next step from the requests waiting then.
        Clients of the requests that just finished send their next one within a few ms; without this
        short wait each batch would start just before they arrive (two closed-loop clients would take
        turns in batches of one). An idle server never waits: this runs only while requests wait."""
        deadline = time.monotonic() + self._gather_s
        with self._wake:
            while (len(self._inbox) + len(self._live) < self.max_batch_size and not self._closing
                   and (left := deadline - time.monotonic()) > 0):
                self._wake.wait(left)

    def _send(self, job: Job, event: str | Finished) -> None:
        self._outbox.append((job, event))

    def _flush(self) -> None:
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        loops = {id(job.loop): job.loop for job, _ in batch}
        for loop in loops.values():
            mine = [item for item in batch if item[0].loop is loop]
            try:
                loop.call_soon_threadsafe(deliver, mine)
            except RuntimeError:  # that loop is closed: its requests are gone
                log.debug("event loop closed; %d events dropped", len(mine))

    def _begin(self, job: Job) -> None:
        started = time.monotonic()
        if not self.healthy:
            self._send(job, Finished("error", 0, started - job.admitted, "the batching engine failed earlier"))
            return
        if job.cancel.is_set() or started >= job.deadline:
            self._send(job, Finished("timeout", 0, started - job.admitted))
            return
        request: Any = None
        try:
            request = self.engine.create_request()
            options = self._turn_options(request, job)
            turn = request.begin_turn(np.asarray(job.prompt_ids, dtype=np.int32), options)
        except Exception as exc:  # a request the engine refuses ends now, with its reason
            log.exception("request %s: the batching engine refused it", job.rid)
            self._send(job, Finished("error", 0, started - job.admitted, f"{type(exc).__name__}: {exc}"))
            if request is not None:
                self._close_request(request, job)
            return
        live = Live(job, request, int(turn), self._tokenizer.create_stream(), StopMatcher(job.params.stop), started)
        self._live[id(request)] = live
        self.stats.resident = len(self._live)

    def _turn_options(self, request: Any, job: Job) -> Any:
        params = job.params
        options = self._og.TurnOptions(request)
        options.set_max_generated_tokens(params.max_tokens)
        if params.ignore_eos:
            options.set_min_generated_tokens(params.max_tokens)
        if sampled(params):
            options.set_do_sample(True)
            options.set_temperature(params.temperature)
            options.set_top_p(params.top_p)
            options.set_top_k(params.top_k)
        else:
            options.set_do_sample(False)
        return options

    def _check_cancels(self) -> None:
        now = time.monotonic()
        for live in list(self._live.values()):
            if live.cancelled_for is None and (live.job.cancel.is_set() or now >= live.job.deadline):
                live.cancelled_for = "timeout"
                try:
                    live.request.cancel_turn(live.turn)
                except Exception:  # already finishing: its last event ends it
                    log.debug("request %s: cancel_turn refused", live.job.rid, exc_info=True)

    def _step(self) -> bool:
        """One engine step; True when it ended a batch (nothing running any more) while requests wait."""
        running_before = any(live.running for live in self._live.values())
        if not self.engine.has_pending_requests():
            # Nothing left to run: requests still listed have had their last event (or never will).
            for live in list(self._live.values()):
                self._end(live, Finished("error", live.count, live.started - live.job.admitted,
                                         "the batching engine dropped the request"))
                self._close(live)
            return False
        try:
            events = self.engine.run(self._buffer)
        except Exception as exc:  # the engine is unusable now: every resident request ends with the error
            log.exception("the batching engine failed; %d requests end with an error", len(self._live))
            self.healthy = False
            self.stats.failures += 1
            for live in list(self._live.values()):
                self._end(live, Finished("error", live.count, live.started - live.job.admitted,
                                         f"{type(exc).__name__}: {exc}"))
            return False
        self.stats.steps += 1
        self.stats.widest = max(self.stats.widest, self._tokens(events))
        for event in events:
            owner = self._live.get(id(event.request))
            if owner is None:
                continue
            if not owner.done:
                self._on_event(owner, event)
            elif event.flags & (self._flags.TURN_FINISHED | self._flags.FAILED):
                self._close(owner)  # a turn cancelled after its stop string: now it may leave
        self.stats.resident = len(self._live)
        waiting = any(not live.running and not live.done for live in self._live.values())
        return running_before and waiting and not any(live.running and not live.done for live in self._live.values())

    def _on_event(self, live: Live, event: Any) -> None:
        flags = event.flags
        live.running = True
        queue_s = live.started - live.job.admitted
        if flags & self._flags.FAILED:
            self._end(live, Finished("error", live.count, queue_s, f"engine error {event.error_code.name}"))
            return
        if flags & self._flags.TOKEN:
            self.stats.batched_tokens += 1
            token = int(event.token)
            if token not in self._eos or live.job.params.ignore_eos:
                live.count += 1
                text, stopped = live.stops.feed(live.stream.decode(token))
                if text:
                    self._send(live.job, text)
                if stopped:
                    live.cancelled_for = "stop"
                    self._cancel_quietly(live)
                    self._end(live, Finished("stop", live.count, queue_s))
                    return
        if flags & self._flags.TURN_FINISHED:
            rest = live.stops.flush()
            if rest:
                self._send(live.job, rest)
            reason = self._reasons.get(event.finish_reason) or live.cancelled_for or "cancelled"
            self._end(live, Finished(reason, live.count, queue_s))

    def _cancel_quietly(self, live: Live) -> None:
        try:
            live.request.cancel_turn(live.turn)
        except Exception:
            log.debug("request %s: cancel_turn refused", live.job.rid, exc_info=True)

    def _end(self, live: Live, finished: Finished) -> None:
        """Send the job its last event once; the request leaves the engine when its turn has finished."""
        if not live.done:
            live.done = True
            self._send(live.job, finished)
            self.stats.services.append(time.monotonic() - live.started)
        if finished.reason == "stop" and live.cancelled_for == "stop":
            return  # stays until the engine reports the cancelled turn finished (see _step)
        self._close(live)

    def _close(self, live: Live) -> None:
        self._live.pop(id(live.request), None)
        self._close_request(live.request, live.job)

    @staticmethod
    def _close_request(request: Any, job: Job) -> None:
        try:
            request.close()
        except Exception:
            log.debug("request %s: close refused", job.rid, exc_info=True)
