"""The OpenAI-compatible HTTP app: /v1/completions, /v1/chat/completions (SSE or whole), /v1/models,
/health, /metrics and /openapi.json. Every response carries the served model, version and serving-config
hash. A request is validated (4xx naming the field), admitted (429 when full), then handed to a Run."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from release.serving.adapters import AdapterLease, AdapterTable
from release.serving.admin import adapter_headers, admin_routes
from release.serving.auth import KeyAuth
from release.serving.engine import Engine, Finished
from release.serving.metrics import Identity, ServerMetrics
from release.serving.openapi import openapi_schema
from release.serving.parsing import parse_body
from release.serving.protocol import (
    ChatRequest,
    CompletionRequest,
    RequestProblem,
    SamplingFields,
    check_params,
    completion_prompt,
    new_id,
)
from release.serving.requestlog import RequestLog
from release.serving.runs import Prepared, Run, RunStream

log = logging.getLogger("relctl.serve")


@dataclass
class ServerState:
    engine: Engine
    identity: Identity
    metrics: ServerMetrics
    request_log: RequestLog
    served_name: str = ""  # the `model` clients send and see (--served-model-name); default model:version
    api_key: str | None = None  # when set, every path but /health and /admin/* needs `Authorization: Bearer <key>`
    admin_key: str | None = None  # the one key /admin/* accepts; None: the admin paths are refused (403)
    adapters: AdapterTable | None = None  # `relctl serve --adapters`: LoRA adapters beside the base
    adapter_base: dict[str, Any] | None = None  # the base the adapters are checked against, as GET /admin states it

    @property
    def model_name(self) -> str:
        return self.served_name or self.identity.model_id


def create_app(state: ServerState) -> ASGIApp:
    """The ASGI app for one loaded model; closing the lifespan stops the worker pool."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        if state.adapters is not None:
            state.adapters.close()
        state.engine.close()

    async def health(_: Request) -> Response:
        engine = state.engine
        batching = engine.batching
        # A failed batching engine sends new requests to the thread pool: still serving, but degraded.
        status = "degraded" if batching.get("healthy") is False else "ok"
        return JSONResponse({
            "status": status, "model": state.identity.model_id, "serving_config": state.identity.serving_config,
            "load_time_s": engine.load_time_s, "in_flight": engine.in_flight, "queue_depth": engine.queue_depth,
            "batching": batching,
        })

    async def metrics(_: Request) -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(_: Request) -> Response:
        ident = state.identity
        card = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "relctl",
                "root": ident.name, "version": ident.version, "serving_config": ident.serving_config,
                "max_model_len": state.engine.context_length,
                "max_batch_size": state.engine.batching["max_batch_size"]}
        cards = [card, *({"id": a.served_name, "object": "model", "created": 0, "owned_by": "relctl",
                          "root": ident.name, "parent": state.model_name, "version": a.version}
                         for a in (state.adapters.listing() if state.adapters else []))]
        return JSONResponse({"object": "list", "data": cards})

    async def openapi(_: Request) -> Response:
        return JSONResponse(openapi_schema(state.identity, state.engine.settings, state.engine.limits,
                                           state.model_name, auth=state.api_key is not None))

    async def completions(request: Request) -> Response:
        return await answer(state, request, chat=False)

    async def chat(request: Request) -> Response:
        return await answer(state, request, chat=True)

    app = Starlette(
        routes=[
            Route("/health", health), Route("/metrics", metrics), Route("/v1/models", models),
            Route("/openapi.json", openapi),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            *admin_routes(state),
        ],
        lifespan=lifespan,
    )
    return IdentityHeaders(KeyAuth(app, state.api_key, state.admin_key, state.metrics), state.identity)


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
        prepared_at = time.monotonic()
    except RequestProblem as problem:
        state.metrics.rejected.labels("invalid").inc()
        state.metrics.requests.labels(endpoint, str(problem.status)).inc()
        return JSONResponse(problem.body(), status_code=problem.status)
    engine = state.engine
    lease = prepared.lease
    if not engine.try_admit():
        if lease is not None:
            lease.release()
        state.metrics.rejected.labels("queue_full").inc()
        state.metrics.requests.labels(endpoint, "429").inc()
        full = RequestProblem("queue", "server at capacity, retry later", status=429)
        return JSONResponse(full.body(), status_code=429, headers={"Retry-After": str(engine.retry_after_s())})
    run = Run(state, prepared, arrived, rid)
    adapter = prepared.adapter
    try:
        # From here the engine gives the adapter lease back when the request's job ends, however it ends.
        events = engine.generate(prepared.prompt_ids, prepared.params, arrived + engine.settings.request_timeout_s,
                                 rid, on_job=run.attach, adapter=adapter.engine_name if adapter else None,
                                 on_end=lease.release if lease is not None else None)
        first = await anext(events)
        first_at = time.monotonic()
    except BaseException:
        run.done = True  # counted by answer()'s handler, not as a finished run
        engine.release()
        raise
    if isinstance(first, Finished) and first.reason in ("timeout", "error"):
        await events.aclose()
        run.finish(first, "504" if first.reason == "timeout" else "500")
        refusal = run.problem(first)
        return JSONResponse(refusal.body(), status_code=refusal.status)
    # Where the time to the first token went, for anyone measuring the server (W3C Server-Timing, ms):
    # reading, parsing, validating and tokenizing; then admission, queueing, prefill and the thread hops.
    timing = f"prepare;dur={(prepared_at - arrived) * 1e3:.2f}, first-token;dur={(first_at - prepared_at) * 1e3:.2f}"
    headers = {"Server-Timing": timing, **adapter_headers(adapter)}
    if prepared.stream:
        return RunStream(run, first, events, headers)
    response = await run.whole(first, events)
    response.headers.update(headers)
    return response


async def prepare(state: ServerState, request: Request, chat: bool) -> Prepared:
    settings = state.engine.settings
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise RequestProblem("body", f"larger than this server's limit of {settings.max_body_bytes} bytes")
    raw = await request.body()
    if len(raw) > settings.max_body_bytes:
        raise RequestProblem("body", f"larger than this server's limit of {settings.max_body_bytes} bytes")
    req: SamplingFields = parse_body(raw, ChatRequest if chat else CompletionRequest)
    ident = state.identity
    if req.model is not None and req.model not in (state.model_name, ident.model_id, ident.name):
        # Leased now: a switch from here on serves this request the version it was routed to.
        lease = state.adapters.acquire(req.model) if state.adapters else None
        if lease is None:
            raise RequestProblem("model", f"'{req.model}' is not served here; this server serves "
                                          f"'{state.model_name}'", status=400)
        try:
            return _prepare(state, req, chat, lease)
        except BaseException:
            lease.release()
            raise
    return _prepare(state, req, chat, None)


def _prepare(state: ServerState, req: SamplingFields, chat: bool, lease: AdapterLease | None) -> Prepared:
    settings, engine = state.engine.settings, state.engine
    params = check_params(req, settings, engine.limits)
    ids: list[int] | None = None
    if isinstance(req, ChatRequest):
        field = "messages"
        try:
            prompt = engine.render_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        except Exception as exc:  # templates raise on conversations they refuse (role order...)
            raise RequestProblem("messages", f"refused by the model's chat template: {exc}") from exc
    else:
        assert isinstance(req, CompletionRequest)
        check_scoring(engine, req)
        field, given = "prompt", completion_prompt(req)
        if isinstance(given, list):
            ids, prompt = token_prompt(engine, given)
        else:
            prompt = given
    if ids is None:
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
    return Prepared("chat" if chat else "completions", chat, req.stream, include_usage, prompt, ids, params, lease)


def check_scoring(engine: Engine, req: CompletionRequest) -> None:
    """`logprobs` and `echo` as far as this backend declares them (LogprobSupport): a 400 naming the backend and
    the field otherwise. Returned on whole responses only."""
    support, backend = engine.logprobs, engine.backend_id or "this"
    if req.logprobs is not None and not support.generated:
        raise RequestProblem("logprobs", f"not available on the {backend} backend: {support.why_not}")
    if req.logprobs is not None and req.echo and not support.prompt:
        raise RequestProblem("echo", f"prompt log-probabilities are not available on the {backend} backend: "
                                     f"{support.why_not}")
    if req.stream and (req.logprobs is not None or req.echo):
        raise RequestProblem("logprobs" if req.logprobs is not None else "echo",
                             "returned on whole responses only; send it with stream false")


def token_prompt(engine: Engine, ids: list[int]) -> tuple[list[int], str]:
    """A prompt given as token ids, checked against the vocabulary, and its text (for echo and the log)."""
    vocab = engine.limits.vocab_size
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise RequestProblem("prompt", f"token id {bad} is outside the model's vocabulary of {vocab} tokens")
    if len(ids) > engine.settings.max_prompt_tokens:
        raise RequestProblem("prompt", f"{len(ids)} tokens, over this server's limit of "
                                       f"{engine.settings.max_prompt_tokens}")
    scorer = engine.scorer
    return ids, scorer.decode(ids) if scorer is not None else f"<{len(ids)} token ids>"
