"""The canary router: an OpenAI-compatible reverse proxy on 127.0.0.1 in front of production and candidate.

Each request goes to one backend: sticky by the hash of its X-Request-Id (the same id always lands on
the same side for a given weight, and raising the weight only moves ids towards the candidate), random
without one. Streams pass through chunk by chunk as they arrive; every response carries
X-Relctl-Backend and the backend's own X-Relctl-* headers. Every request becomes one RouterRecord (a
superset of the load generator's Record, format in docs/canary.md). A weight change applies to the next
request. Shadow mode mirrors a share of production's requests to the candidate and throws the
candidate's answer away after recording it: clients only ever see production's answers.

Two sides on ONE server (adapter versions on one base, docs/canary.md): `models` names the OpenAI `model`
each side's requests are rewritten to (`tiny-llm-support` / `tiny-llm-support:2`), `headers` adds headers
per side (the server's API key); both URLs may then be the same.

Admin: GET/POST /relctl/weights ({"candidate": 0..1, "shadow": 0..1, "step": "label"}); in process,
Router.set_weights(). X-Relctl-Pin: production|candidate forces a side (warm-up, benchmarks).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import time
import uuid
from typing import Any

import aiohttp
from starlette.types import Message, Receive, Scope, Send

from release.serving.router.records import RouterRecord
from release.serving.router.tally import Tally

BACKENDS = ("production", "candidate")
PROXIED = ("/v1/completions", "/v1/chat/completions")


def fraction(request_id: str, salt: str = "") -> float:
    """A stable number in [0, 1) for a request id: the sticky split."""
    digest = hashlib.blake2b(f"{salt}{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def base_url(url: str) -> str:
    """A backend URL without a trailing /v1 (the proxied path brings it), path prefixes kept."""
    base = url.rstrip("/")
    return base.removesuffix("/v1")


class Router:
    """The proxy's state and ASGI app. Create it, serve `router` with uvicorn (see RouterServer)."""

    def __init__(self, production_url: str, candidate_url: str, candidate_weight: float = 0.0,
                 shadow_share: float = 0.0, record_text: bool = False, timeout_s: float = 60.0,
                 models: dict[str, str] | None = None, headers: dict[str, dict[str, str]] | None = None) -> None:
        self.urls = {"production": base_url(production_url), "candidate": base_url(candidate_url)}
        self.models = dict(models or {})      # backend -> the `model` its requests are rewritten to
        self.headers = {b: dict((headers or {}).get(b, {})) for b in BACKENDS}
        self.record_text = record_text
        self.timeout_s = timeout_s
        self.candidate_weight = 0.0
        self.shadow_share = 0.0
        self.step = ""
        self.records: list[RouterRecord] = []
        self.weight_changes: list[dict[str, Any]] = []
        self.t0 = time.perf_counter()
        self._session: aiohttp.ClientSession | None = None
        self._counter = itertools.count()
        self._shadows: set[asyncio.Task[None]] = set()
        self.set_weights(candidate_weight, shadow_share)

    def set_weights(self, candidate: float | None = None, shadow: float | None = None, step: str | None = None
                    ) -> float:
        """Apply new weights for every request that arrives from now on; returns the perf_counter time."""
        for name, value in (("candidate", candidate), ("shadow", shadow)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} weight {value}: must be between 0 and 1")
        if step is not None:
            self.step = step
        if shadow is not None:
            self.shadow_share = shadow
        if candidate is not None:
            self.candidate_weight = candidate
        now = time.perf_counter()
        self.weight_changes.append({"at_s": now - self.t0, "candidate": self.candidate_weight,
                                    "shadow": self.shadow_share, "step": self.step})
        return now

    def weights(self) -> dict[str, Any]:
        return {"candidate": self.candidate_weight, "shadow": self.shadow_share, "step": self.step}

    async def drain_shadows(self) -> None:
        """Wait for mirrored requests still in flight (their records are part of the run)."""
        if self._shadows:
            await asyncio.gather(*list(self._shadows), return_exceptions=True)

    # --- ASGI -------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path in PROXIED:
            await self._proxy(scope, receive, send, path)
        elif path == "/relctl/weights":
            await self._admin(method, receive, send)
        elif path == "/health":
            await _json(send, 200, {"status": "ok", **self.weights(), "backends": self.urls})
        elif path == "/v1/models" and method == "GET":
            await self._models(send)
        else:
            await _json(send, 404, {"error": {"message": f"{method} {path}: not routed", "code": 404}})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
                self._session = aiohttp.ClientSession(connector=connector, read_bufsize=1 << 20,
                                                      timeout=aiohttp.ClientTimeout(total=self.timeout_s))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.drain_shadows()
                if self._session is not None:
                    await self._session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _admin(self, method: str, receive: Receive, send: Send) -> None:
        if method == "POST":
            try:
                body = json.loads(await _body(receive) or b"{}")
                applied = self.set_weights(_weight(body, "candidate"), _weight(body, "shadow"),
                                           str(body["step"]) if "step" in body else None)
            except (ValueError, TypeError, AttributeError) as exc:
                await _json(send, 400, {"error": {"message": str(exc), "code": 400}})
                return
            await _json(send, 200, {**self.weights(), "applied_s": applied - self.t0})
            return
        await _json(send, 200, self.weights())

    async def _models(self, send: Send) -> None:
        assert self._session is not None
        try:
            async with self._session.get(self.urls["production"] + "/v1/models",
                                         headers=self.headers["production"]) as resp:
                await _json(send, resp.status, await resp.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await _json(send, 502, {"error": {"message": f"production: {exc.__class__.__name__}", "code": 502}})

    def choose(self, request_id: str | None, pin: str | None) -> str:
        if pin in BACKENDS:
            return str(pin)
        point = fraction(request_id) if request_id else random.random()
        return "candidate" if point < self.candidate_weight else "production"

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        arrived = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = await _body(receive)
        given = headers.get("x-request-id")
        request_id = given or uuid.uuid4().hex
        pin = headers.get("x-relctl-pin")
        backend = self.choose(given, pin)
        if (backend == "production" and pin is None and self.shadow_share > 0
                and fraction(request_id, "shadow") < self.shadow_share):
            task = asyncio.create_task(self._forward("candidate", path, body, request_id, arrived, None, True))
            self._shadows.add(task)
            task.add_done_callback(self._shadows.discard)
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        try:
            await self._forward(backend, path, body, request_id, arrived, send, False, gone)
        finally:
            watcher.cancel()

    async def _forward(self, backend: str, path: str, body: bytes, request_id: str, arrived: float,
                       send: Send | None, mirrored: bool, gone: asyncio.Event | None = None) -> None:
        assert self._session is not None
        rec = RouterRecord(next(self._counter), arrived - self.t0, request_id=request_id, backend=backend,
                           mirrored=mirrored, step=self.step, path=path)
        sent = time.perf_counter()
        rec.sent_s, rec.lag_s, rec.sent_at = sent - self.t0, sent - arrived, time.time()
        tally = Tally(sent, self.record_text)
        started = False
        try:
            async with self._session.post(self.urls[backend] + path, data=with_model(body, self.models.get(backend)),
                                          headers={**self.headers[backend], "Content-Type": "application/json",
                                                   "X-Request-Id": request_id}) as resp:
                rec.http_status = resp.status
                rec.model = resp.headers.get("X-Relctl-Model")
                rec.version = resp.headers.get("X-Relctl-Version")
                rec.adapter = resp.headers.get("X-Relctl-Adapter")
                rec.adapter_version = resp.headers.get("X-Relctl-Adapter-Version")
                rec.serving_config = resp.headers.get("X-Relctl-Serving-Config")
                tally.stream = resp.headers.get("Content-Type", "").startswith("text/event-stream")
                if send is not None:
                    await send({"type": "http.response.start", "status": resp.status,
                                "headers": _response_headers(resp, backend, request_id)})
                    started = True
                async for chunk in resp.content.iter_any():
                    tally.feed(chunk, time.perf_counter())
                    if send is not None:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if gone is not None and gone.is_set():
                        tally.fail("client_gone", "the client left before the answer ended")
                        break
                tally.finish(resp.status)
        except TimeoutError:
            tally.fail("timeout", f"no complete answer within {self.timeout_s}s")
        except aiohttp.ClientConnectorError as exc:
            tally.fail("connect", str(exc)[:300])
        except (aiohttp.ClientError, ValueError) as exc:
            tally.fail("disconnect", f"{exc.__class__.__name__}: {exc}"[:300])
        tally.apply(rec)
        self.records.append(rec)
        if send is None:
            return
        if not started:
            status = 504 if rec.status == "timeout" else 502
            await _json(send, status, {"error": {"message": f"{backend}: {rec.error}", "code": status}},
                        [(b"x-relctl-backend", backend.encode())])
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def with_model(body: bytes, model: str | None) -> bytes:
    """The request body with its OpenAI `model` field set to `model` (None, or a body that is no JSON object:
    unchanged, and the backend answers it as it would)."""
    if model is None:
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    data["model"] = model
    return json.dumps(data).encode()


def _response_headers(resp: aiohttp.ClientResponse, backend: str, request_id: str) -> list[tuple[bytes, bytes]]:
    keep = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()
            if k.lower().startswith("x-relctl-") or k.lower() in ("content-type", "retry-after", "cache-control")]
    return [*keep, (b"x-relctl-backend", backend.encode()), (b"x-request-id", request_id.encode("latin-1"))]


def _weight(body: Any, key: str) -> float | None:
    if key not in body:
        return None
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key}: must be a number between 0 and 1")
    return float(value)


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message: Message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _json(send: Send, status: int, data: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(data).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": payload})
