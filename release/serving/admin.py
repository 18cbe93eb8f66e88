"""Run-time adapter administration on a serving base (`relctl serve --adapters`, docs/adapters.md):

    GET  /admin/adapters   what is served: {"base": {...}, "adapters": [{model, version, engine_name,
                           served_name}], "in_flight": {engine_name: requests}, "draining": {engine_name:
                           requests still using a replaced version}}
    POST /admin/adapters   {"model": M, "version": "3"}   serve M at v3 (no version: M's production)
    POST /admin/adapters   {"model": "M:3"}   also serve M v3 under the name M:3, M itself untouched (a canary)
    POST /admin/adapters/unload   {"model": M}   (or "M:3")

Behind the server's admin key (`--admin-key`, RELCTL_ADMIN_KEY; release/serving/app.py KeyAuth): a server
started without one refuses these paths (403), and so does a completions key. Every version loaded is
fetched and verified as serve verifies its base (manifest digest, signature), must be bound by its signed
manifest to this server's base (`base` above, from the base's own verified package) and be in a release
state its served name allows (a rejected version never serves): 409 with the reason otherwise. The switch
loads the new version before the old one is unloaded, and the old one stays loaded until the last request
using it has finished (release/serving/adapters.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from release.core.errors import ReleaseError
from release.serving.adapters import split_pinned
from release.serving.parsing import decode_json
from release.serving.protocol import RequestProblem

if TYPE_CHECKING:
    from release.serving.adapters import ServedAdapter
    from release.serving.app import ServerState

ADMIN_PREFIX = "/admin"


def adapter_headers(adapter: ServedAdapter | None) -> dict[str, str]:
    """X-Relctl-Adapter and -Adapter-Version on an answer generated with an adapter (the base's own
    X-Relctl-Model/-Version are on every response)."""
    if adapter is None:
        return {}
    return {"X-Relctl-Adapter": adapter.model, "X-Relctl-Adapter-Version": adapter.version}


def _listing(state: ServerState) -> list[dict[str, str]]:
    table = state.adapters
    return [{"model": a.model, "version": a.version, "engine_name": a.engine_name, "served_name": a.served_name}
            for a in (table.listing() if table else [])]


def admin_routes(state: ServerState) -> list[Route]:
    """The admin paths (KeyAuth has let only the admin key through), 404 unless the server serves adapters."""

    def refused() -> Response | None:
        if state.adapters is None:
            problem = RequestProblem("adapters", "this server does not serve adapters (start it with --adapters)",
                                     status=404)
            return JSONResponse(problem.body(), status_code=404)
        return None

    async def listing(_: Request) -> Response:
        table = state.adapters
        return refused() or JSONResponse({"base": state.adapter_base, "adapters": _listing(state),
                                          "in_flight": table.in_flight() if table else {},
                                          "draining": table.draining() if table else {}})

    async def admitted(request: Request) -> dict[str, Any] | Response:
        """The request's body once the server may answer admin requests at all; else the refusal."""
        return refused() or await _body(request)

    async def load(request: Request) -> Response:
        body = await admitted(request)
        if isinstance(body, Response):
            return body
        version = body.get("version")
        if version is not None and not isinstance(version, str):
            return _bad("version", "must be a string like \"3\"")
        try:
            model, pinned = split_pinned(body["model"])
        except ReleaseError as exc:
            return _bad("model", exc.message)
        if pinned is not None and version not in (None, pinned):
            return _bad("version", f"{version} contradicts the pinned name {body['model']}")
        assert state.adapters is not None
        table = state.adapters
        started = time.monotonic()
        try:
            if pinned is not None:
                old, new = await asyncio.to_thread(table.pin, model, pinned)
            else:
                old, new = await asyncio.to_thread(table.switch, model, version)
        except ReleaseError as exc:
            return _bad("model", exc.message, 409)
        return JSONResponse({"model": new.model, "version": new.version, "served_name": new.served_name,
                             "replaced": old.version if old else None,
                             "seconds": round(time.monotonic() - started, 3), "adapters": _listing(state)})

    async def unload(request: Request) -> Response:
        body = await admitted(request)
        if isinstance(body, Response):
            return body
        assert state.adapters is not None
        table = state.adapters
        try:
            old = await asyncio.to_thread(table.remove, body["model"])
        except ReleaseError as exc:
            return _bad("model", exc.message, 404)
        return JSONResponse({"unloaded": old.model, "version": old.version, "adapters": _listing(state)})

    return [Route(f"{ADMIN_PREFIX}/adapters", listing, methods=["GET"]),
            Route(f"{ADMIN_PREFIX}/adapters", load, methods=["POST"]),
            Route(f"{ADMIN_PREFIX}/adapters/unload", unload, methods=["POST"])]


async def _body(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object through the server's one bounded decoder, naming the adapter's model."""
    raw = await request.body()
    if len(raw) > 4096:
        return _bad("body", "larger than 4096 bytes")
    try:
        body = decode_json(raw)
    except RequestProblem as problem:
        return JSONResponse(problem.body(), status_code=problem.status)
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _bad("model", "required: the adapter's registered model name")
    return body


def _bad(field: str, message: str, status: int = 400) -> Response:
    return JSONResponse(RequestProblem(field, message, status=status).body(), status_code=status)
