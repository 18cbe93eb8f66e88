"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions (SSE or whole), /v1/models,
/health and /metrics. Every response carries the served model, version and serving-config hash."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from release.serving.engine import Engine, Finished
from release.serving.metrics import Identity, ServerMetrics
from release.serving.parsing import parse_body
from release.serving.protocol import (
    ChatRequest,
    CompletionRequest,
    GenerationParams,
    RequestProblem,
    SamplingFields,
    check_params,
    chunk_body,
    completion_body,
    completion_prompt,
    new_id,
    sse,
    usage,
)
from release.serving.requestlog import RequestLog

log = logging.getLogger("relctl.serve")


@dataclass
class ServerState:
    engine: Engine
    identity: Identity
    metrics: ServerMetrics
    request_log: RequestLog


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


def create_app(state: ServerState) -> ASGIApp:
    """The ASGI app for one loaded model; closing the lifespan stops the worker pool."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        state.engine.close()

    async def health(_: Request) -> Response:
        engine = state.engine
        return JSONResponse({
            "status": "ok", "model": state.identity.model_id, "serving_config": state.identity.serving_config,
            "load_time_s": engine.load_time_s, "in_flight": engine.in_flight, "queue_depth": engine.queue_depth,
        })

    async def metrics(_: Request) -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(_: Request) -> Response:
        ident = state.identity
        card = {"id": ident.model_id, "object": "model", "created": 0, "owned_by": "relctl",
                "root": ident.name, "version": ident.version, "serving_config": ident.serving_config,
                "max_model_len": state.engine.context_length}
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(request: Request) -> Response:
        return await answer(state, request, chat=False)

    async def chat(request: Request) -> Response:
        return await answer(state, request, chat=True)

    app = Starlette(
        routes=[
            Route("/health", health), Route("/metrics", metrics), Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    return IdentityHeaders(app, state.identity)


class IdentityHeaders:
    """Adds the X-Relctl-* headers to every response, streamed ones included (pure ASGI: no buffering)."""

    def __init__(self, app: ASGIApp, identity: Identity) -> None:
        self.app = app
        self.extra = identity.headers()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def answer(state: ServerState, request: Request, chat: bool) -> Response:
    """One completion request, whatever happens: a 4xx for the client's mistakes, 429/504 for capacity,
    and for a fault of this server a 500 that is logged with the request id and counted."""
    arrived = time.monotonic()
    endpoint = "chat" if chat else "completions"
    rid = new_id("chatcmpl" if chat else "cmpl")
    try:
        response = await _answer(state, request, chat, endpoint, rid, arrived)
    except Exception as exc:  # the one place a server fault becomes a counted 500
        log.exception("request %s: server error", rid)
        state.metrics.errors.labels("server").inc()
        state.metrics.requests.labels(endpoint, "500").inc()
        problem = RequestProblem("server", f"internal error ({type(exc).__name__}); request id {rid}", status=500)
        response = JSONResponse(problem.body(), status_code=500)
    response.headers["x-request-id"] = rid
    return response


async def _answer(state: ServerState, request: Request, chat: bool, endpoint: str, rid: str,
                  arrived: float) -> Response:
    try:
        prepared = await prepare(state, request, chat)
    except RequestProblem as problem:
        state.metrics.rejected.labels("invalid").inc()
        state.metrics.requests.labels(endpoint, str(problem.status)).inc()
        return JSONResponse(problem.body(), status_code=problem.status)
    engine = state.engine
    if not engine.try_admit():
        state.metrics.rejected.labels("queue_full").inc()
        state.metrics.requests.labels(endpoint, "429").inc()
        full = RequestProblem("queue", "server at capacity, retry later", status=429)
        return JSONResponse(full.body(), status_code=429, headers={"Retry-After": str(engine.retry_after_s())})
    run = Run(state, prepared, arrived, rid)
    try:
        events = engine.generate(prepared.prompt_ids, prepared.params, arrived + engine.settings.request_timeout_s,
                                 rid)
        first = await anext(events)
    except BaseException:
        run.done = True  # counted by answer()'s handler, not as a finished run
        engine.release()
        raise
    if isinstance(first, Finished) and first.reason in ("timeout", "error"):
        await events.aclose()
        run.finish(first, "504" if first.reason == "timeout" else "500")
        refusal = run.problem(first)
        return JSONResponse(refusal.body(), status_code=refusal.status)
    if prepared.stream:
        return RunStream(run, first, events)
    return await run.whole(first, events)


async def prepare(state: ServerState, request: Request, chat: bool) -> Prepared:
    settings, engine = state.engine.settings, state.engine
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise RequestProblem("body", f"larger than this server's limit of {settings.max_body_bytes} bytes")
    raw = await request.body()
    if len(raw) > settings.max_body_bytes:
        raise RequestProblem("body", f"larger than this server's limit of {settings.max_body_bytes} bytes")
    req: SamplingFields = parse_body(raw, ChatRequest if chat else CompletionRequest)
    ident = state.identity
    if req.model is not None and req.model not in (ident.model_id, ident.name):
        raise RequestProblem("model", f"'{req.model}' is not served here; this server serves '{ident.model_id}'",
                             status=400)
    params = check_params(req, settings, engine.limits)
    if isinstance(req, ChatRequest):
        field = "messages"
        try:
            prompt = engine.render_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        except Exception as exc:  # templates raise on conversations they refuse (role order...)
            raise RequestProblem("messages", f"refused by the model's chat template: {exc}") from exc
    else:
        assert isinstance(req, CompletionRequest)
        field, prompt = "prompt", completion_prompt(req)
    # Refused before tokenizing, which would block the event loop on a huge string: real text averages
    # about 4 characters per token, so 32 per allowed token only stops abuse.
    if len(prompt) > 32 * settings.max_prompt_tokens:
        raise RequestProblem(field, f"longer than this server's limit of {settings.max_prompt_tokens} tokens")
    ids = engine.encode(prompt)
    if not ids:
        raise RequestProblem(field, "must not be empty")
    if len(ids) > settings.max_prompt_tokens:
        raise RequestProblem(field, f"{len(ids)} tokens, over this server's limit of {settings.max_prompt_tokens}")
    if len(ids) + params.max_tokens > engine.context_length:
        raise RequestProblem(
            "max_tokens", f"prompt ({len(ids)}) + max_tokens ({params.max_tokens}) exceeds the model's context "
            f"of {engine.context_length} tokens")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return Prepared("chat" if chat else "completions", chat, req.stream, include_usage, prompt, ids, params)


class RunStream(StreamingResponse):
    """The SSE response of one run. However the response ends (finished, client gone before or during
    the stream, shutdown) the generation is stopped and the admission slot is given back exactly once."""

    def __init__(self, run: Run, first: str | Finished, events: AsyncGenerator[str | Finished, None]) -> None:
        self.run = run
        self.events = events
        super().__init__(run.stream(first, events), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})

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

    async def stream(self, first: str | Finished, events: AsyncGenerator[str | Finished, None]) -> AsyncIterator[bytes]:
        model, chat = self.state.identity.model_id, self.p.chat
        finished: Finished | None = None
        try:
            async with aclosing(events) as rest:
                event: str | Finished = first
                is_first = True
                while True:
                    if isinstance(event, Finished):
                        finished = event
                        break
                    self.note(event)
                    yield sse(chunk_body(self.rid, model, event, None, chat, is_first))
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
        body = completion_body(self.rid, self.state.identity.model_id, "".join(self.pieces), finished.reason, self.p.chat)
        body["usage"] = usage(len(self.p.prompt_ids), finished.output_tokens)
        return Response(json.dumps(body), media_type="application/json")

    @staticmethod
    def code(finished: Finished) -> str:
        return {"timeout": "504", "error": "500"}.get(finished.reason, "200")

    def problem(self, finished: Finished) -> RequestProblem:
        """The error a timed-out or failed generation answers with (a body, or the stream's last event)."""
        if finished.reason == "timeout":
            where = "before the first token (queue wait + prefill)" if self.first_token_at is None else ""
            return RequestProblem("request", f"timed out {where or 'during generation'}", status=504)
        return RequestProblem("server", f"generation failed ({finished.error}); request id {self.rid}", status=500)

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


def from_finish(run: Run, finished: Finished, is_first: bool) -> bytes:
    """The closing chunk: finish_reason, or an error event when the request timed out or failed mid-stream."""
    if finished.reason in ("timeout", "error"):
        return sse(run.problem(finished).body())
    return sse(chunk_body(run.rid, run.state.identity.model_id, None, finished.reason, run.p.chat, is_first))
