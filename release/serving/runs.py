"""One admitted request turned into a response: the SSE stream or the whole JSON body, then its metrics
and its request-log line, exactly once however the response ends."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from release.backends.jobs import GenerationParams, Job
from release.serving.engine import Finished
from release.serving.protocol import (
    ChunkFormat,
    RequestProblem,
    chunk_body,
    completion_body,
    listed_tokens,
    logprobs_body,
    sse,
    usage,
)

if TYPE_CHECKING:
    from release.serving.adapters import AdapterLease, ServedAdapter
    from release.serving.app import ServerState


@dataclass(frozen=True)
class Prepared:
    """A validated request, ready for admission."""

    endpoint: str
    chat: bool
    stream: bool
    include_usage: bool
    prompt: str
    prompt_ids: list[int]
    params: GenerationParams
    # The request's lease on the LoRA adapter version its `model` field named (release/serving/adapters.py):
    # given back when its job has ended in the engine, or by whoever refuses the request before that.
    lease: AdapterLease | None = None

    @property
    def adapter(self) -> ServedAdapter | None:
        return self.lease.adapter if self.lease is not None else None


class RunStream(StreamingResponse):
    """The SSE response of one run. However the response ends (finished, client gone before or during
    the stream, shutdown) the generation is stopped and the admission slot is given back exactly once."""

    def __init__(self, run: Run, first: str | Finished, events: AsyncGenerator[str | Finished, None],
                 headers: dict[str, str] | None = None) -> None:
        self.run = run
        self.events = events
        super().__init__(run.stream(first, events), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            body = self.body_iterator
            if isinstance(body, AsyncGenerator):
                await body.aclose()
            if not self.run.done:
                await self.events.aclose()
                self.run.finish(None, "499")


class Run:
    """One admitted request: turns engine events into a response, then records metrics and the log line."""

    def __init__(self, state: ServerState, prepared: Prepared, arrived: float, rid: str) -> None:
        self.done = False
        self.state = state
        self.p = prepared
        self.arrived = arrived
        self.rid = rid
        self.first_token_at: float | None = None
        self.pieces: list[str] = []
        self.job: Job | None = None  # set by the engine once generation starts; holds a scored run's scores

    async def stream(self, first: str | Finished, events: AsyncGenerator[str | Finished, None]) -> AsyncIterator[bytes]:
        model, chat = self.state.model_name, self.p.chat
        finished: Finished | None = None
        try:
            async with aclosing(events) as rest:
                event: str | Finished = first
                is_first = True
                chunks = ChunkFormat(self.rid, model, chat)
                while True:
                    if isinstance(event, Finished):
                        finished = event
                        break
                    self.note(event)
                    yield sse(chunk_body(self.rid, model, event, None, chat, True)) if is_first else chunks.text(event)
                    is_first = False
                    event = await anext(rest)
            yield from_finish(self, finished, is_first)
            if finished.reason in ("timeout", "error"):
                return
            if self.p.include_usage:
                body = chunk_body(self.rid, model, None, None, chat, False)
                body["choices"] = []
                body["usage"] = usage(len(self.p.prompt_ids), finished.output_tokens)
                yield sse(body)
            yield sse("[DONE]")
        finally:
            self.finish(finished, "499" if finished is None else self.code(finished))

    async def whole(self, first: str | Finished, events: AsyncGenerator[str | Finished, None]) -> Response:
        finished: Finished | None = None
        try:
            async with aclosing(events) as rest:
                event: str | Finished = first
                while not isinstance(event, Finished):
                    self.note(event)
                    event = await anext(rest)
                finished = event
        finally:
            self.finish(finished, "499" if finished is None else self.code(finished))
        if finished.reason in ("timeout", "error"):
            problem = self.problem(finished)
            return JSONResponse(problem.body(), status_code=problem.status)
        text = "".join(self.pieces)
        params = self.p.params
        body = completion_body(self.rid, self.state.model_name, self.p.prompt + text if params.echo else text,
                               finished.reason, self.p.chat)
        if params.scored:
            body["choices"][0]["logprobs"] = self.logprobs(text, finished.reason)
        body["usage"] = usage(len(self.p.prompt_ids), finished.output_tokens)
        return Response(json.dumps(body), media_type="application/json")

    def logprobs(self, text: str, reason: str) -> dict[str, Any]:
        """The response's `logprobs`: the prompt's tokens (echo), then every generated token and a final EOS
        (docs/harness.md), by the runner's scores; after a stop string, only the tokens whose text starts within
        the returned text (the stop string's tokens are cut with it)."""
        engine = self.state.engine
        scorer = engine.scorer
        assert scorer is not None and self.job is not None  # a scored request is admitted only then
        prompt = self.job.prompt_scores if self.p.params.echo else []
        output = self.job.output_scores
        kept = listed_tokens([s.token for s in output], engine.runner.eos_ids, text, reason, scorer.decode)
        texts = scorer.token_texts([s.token for s in output[:kept]])
        scores = [*prompt, *output[:kept]]
        all_texts = scorer.token_texts([s.token for s in prompt]) + texts
        shown = {t for s in scores for t, _ in s.top or ()}
        names = dict(zip(sorted(shown), scorer.token_texts(sorted(shown)), strict=True))
        tops: list[dict[str, float] | None] = []
        for score in scores:
            tops.append(None if score.top is None else _by_text(score.top, names))
        return logprobs_body(scores, all_texts, tops)

    @staticmethod
    def code(finished: Finished) -> str:
        return {"timeout": "504", "error": "500"}.get(finished.reason, "200")

    def problem(self, finished: Finished) -> RequestProblem:
        """The error a timed-out or failed generation answers with (a body, or the stream's last event)."""
        if finished.reason == "timeout":
            where = "before the first token (queue wait + prefill)" if self.first_token_at is None else ""
            return RequestProblem("request", f"timed out {where or 'during generation'}", status=504)
        return RequestProblem("server", f"generation failed ({finished.error}); request id {self.rid}", status=500)

    def attach(self, job: Job) -> None:
        self.job = job

    def note(self, piece: str) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.pieces.append(piece)

    def finish(self, finished: Finished | None, code: str) -> None:
        if self.done:
            return
        self.done = True
        state, now = self.state, time.monotonic()
        state.engine.release()
        m = state.metrics
        m.requests.labels(self.p.endpoint, code).inc()
        m.prompt_tokens.inc(len(self.p.prompt_ids))
        if finished is not None:
            m.output_tokens.inc(finished.output_tokens)
            m.queue_wait.observe(finished.queue_s)
            if finished.reason == "error":
                m.errors.labels("generation").inc()
        if self.first_token_at is not None:
            m.ttft.observe(self.first_token_at - self.arrived)
        m.e2e.observe(now - self.arrived)
        record = {"id": self.rid, "endpoint": self.p.endpoint, "model": state.identity.model_id,
                  "serving_config": state.identity.serving_config, "status": code,
                  "finish_reason": finished.reason if finished else None,
                  "prompt_tokens": len(self.p.prompt_ids),
                  "output_tokens": finished.output_tokens if finished else None,
                  "latency_s": round(now - self.arrived, 6)}
        state.request_log.write(record, self.p.prompt, "".join(self.pieces))


def _by_text(top: tuple[tuple[int, float], ...], names: dict[int, str]) -> dict[str, float]:
    """OpenAI keys alternatives by token text; two ids with one text keep the likelier."""
    out: dict[str, float] = {}
    for token, logprob in top:
        out.setdefault(names[token], logprob)
    return out


def from_finish(run: Run, finished: Finished, is_first: bool) -> bytes:
    """The closing chunk: finish_reason, or an error event when the request timed out or failed mid-stream."""
    if finished.reason in ("timeout", "error"):
        return sse(run.problem(finished).body())
    return sse(chunk_body(run.rid, run.state.model_name, None, finished.reason, run.p.chat, is_first))
