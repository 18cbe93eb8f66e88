"""`relctl webhook`: MLflow model-registry webhooks in, promotes out.

MLflow (3.17, mlflow/webhooks/delivery.py) signs each delivery Standard-Webhooks style: header
`X-MLflow-Signature: v1,<base64 HMAC-SHA256 of "<delivery id>.<timestamp>.<body>">` with the webhook's
secret, beside `X-MLflow-Delivery-Id` and `X-MLflow-Timestamp` (unix seconds). A delivery is accepted only
when the signature matches, the timestamp is within the window and the delivery id was not seen before;
anything else is 401 and starts nothing. An accepted `model_version.created` (with the release tag among
its tags) or `model_version_tag.set` (of the release tag) starts one promote of the version's source run:
a subprocess, or a GitHub `repository_dispatch` that runs the promote workflow.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from release.core.errors import InputError
from release.core.jsonfile import parse_json
from release.core.model_name import bad_model_name

# The header names are MLflow's own constants, so a rename there breaks here loudly.
from release.registry.webhooks import (
    WEBHOOK_DELIVERY_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_SIGNATURE_VERSION,
    WEBHOOK_TIMESTAMP_HEADER,
)

# An MLflow run id is 32 hex digits; anything else (a leading '-' above all: it would reach the promote
# command line as an option) is refused. Versions are MLflow's decimal version numbers.
RUN_ID = re.compile(r"[0-9a-f]{32}")
VERSION = re.compile(r"[1-9][0-9]{0,9}")
DEFAULT_MAX_BODY = 1024 * 1024  # MLflow's deliveries are a few KB: a megabyte is ample headroom
DEFAULT_BODY_TIMEOUT_S = 10.0   # a body not complete by then is a slow client holding a connection: 408
MAX_JSON_DEPTH = 16             # MLflow's payloads nest 3 levels
MAX_STATE_BYTES = 16 * 1024 * 1024
Trigger = Callable[["ReleaseRequest"], str]


class MalformedPayload(ValueError):
    """A signed delivery whose JSON is not the shape MLflow sends: 400, never a crash (500)."""


@dataclass(frozen=True)
class ReleaseRequest:
    """A registry event that asks for a release: which version, and the training run to promote."""

    model: str
    version: str
    run_id: str
    delivery_id: str


def sign(secret: str, delivery_id: str, timestamp: str, body: bytes) -> str:
    """The `X-MLflow-Signature` value MLflow sends for this delivery."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).digest()
    return f"{WEBHOOK_SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def signature_matches(secret: str, delivery_id: str, timestamp: str, body: bytes, header: str) -> bool:
    """True when one of the space-separated `v1,<sig>` entries of `header` is this body's signature."""
    expected = sign(secret, delivery_id, timestamp, body)
    return any(hmac.compare_digest(candidate.encode(), expected.encode()) for candidate in header.split())


class SeenDeliveries:
    """Delivery ids accepted within the timestamp window, kept in a file so a restart still refuses replays."""

    def __init__(self, path: Path, window_s: float) -> None:
        self.path = path
        self.window_s = window_s
        self.lock = threading.Lock()
        self.seen: dict[str, float] = {}
        self.damaged = 0   # lines a crash or a full disk cut short: skipped, counted, never fatal
        if path.is_file():
            for line in path.read_bytes()[:MAX_STATE_BYTES].splitlines():
                try:
                    entry = parse_json(line, path.name, "")
                    self.seen[str(entry["id"])] = float(entry["at"])
                except (InputError, KeyError, TypeError, ValueError):
                    self.damaged += 1

    def claim(self, delivery_id: str, now: float) -> bool:
        """Record `delivery_id`; False when it was already recorded (a replay)."""
        with self.lock:
            self.seen = {d: t for d, t in self.seen.items() if now - t <= 2 * self.window_s}
            if delivery_id in self.seen:
                return False
            self.seen[delivery_id] = now
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.partial")   # whole or not at all: temp + rename
            tmp.write_text("".join(json.dumps({"id": d, "at": t}) + "\n" for d, t in self.seen.items()))
            tmp.replace(self.path)
            return True

    def release(self, delivery_id: str) -> None:
        """Forget a delivery whose promote could not start, so MLflow's retry of it is accepted."""
        with self.lock:
            self.seen.pop(delivery_id, None)


@dataclass
class WebhookSettings:
    """What the receiver accepts and what it does with a release event."""

    secret: str
    state_dir: Path
    trigger: Trigger
    # Looks up a version's source run (tag events carry only name and version).
    version_run: Callable[[str, str], str | None]
    release_tag: str = "relctl.release"
    release_value: str = "true"
    max_age_s: float = 300.0
    # Bytes of body read at most; a longer one is refused (413) without being read to its end.
    max_body_bytes: int = DEFAULT_MAX_BODY
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    clock: Callable[[], float] = time.time
    started: dict[tuple[str, str], str] = field(default_factory=dict)


def create_app(settings: WebhookSettings) -> Starlette:
    """The receiver: POST / (and /webhook) take MLflow deliveries; GET /health answers 200."""
    seen = SeenDeliveries(settings.state_dir / "webhook-deliveries.jsonl", settings.max_age_s)
    started_lock = threading.Lock()

    def refuse(reason: str, status: int = 401) -> JSONResponse:
        # Answered before the body is read (or read to its end): the connection is closed after, so the
        # rest of the body is never read, let alone held.
        return JSONResponse({"accepted": False, "reason": reason}, status_code=status, headers={"Connection": "close"})

    async def read_body(request: Request) -> bytes | None:
        """The body, or None once it passes max_body_bytes (a chunked body is not read further)."""
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > settings.max_body_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def receive(request: Request) -> JSONResponse:
        # Everything that needs no body is checked first: an unsigned or oversized POST costs no memory.
        delivery_id = request.headers.get(WEBHOOK_DELIVERY_ID_HEADER, "")
        timestamp = request.headers.get(WEBHOOK_TIMESTAMP_HEADER, "")
        signature = request.headers.get(WEBHOOK_SIGNATURE_HEADER, "")
        if not (delivery_id and timestamp and signature):
            return refuse(f"missing {WEBHOOK_DELIVERY_ID_HEADER}, {WEBHOOK_TIMESTAMP_HEADER} or "
                          f"{WEBHOOK_SIGNATURE_HEADER}")
        if len(delivery_id) > 200 or len(signature) > 2000 or not signature.startswith(WEBHOOK_SIGNATURE_VERSION):
            return refuse("malformed signature headers")
        now = settings.clock()
        try:
            age = now - int(timestamp)
        except ValueError:
            return refuse("timestamp is not unix seconds")
        if abs(age) > settings.max_age_s:
            return refuse(f"stale timestamp: {age:.0f}s old, the window is {settings.max_age_s:.0f}s")
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > settings.max_body_bytes):
            return refuse(f"body of {declared} bytes; at most {settings.max_body_bytes} are read", 413)
        try:
            body = await asyncio.wait_for(read_body(request), settings.body_timeout_s)
        except TimeoutError:
            return refuse(f"body not received within {settings.body_timeout_s:.0f}s", 408)
        if body is None:
            return refuse(f"body over {settings.max_body_bytes} bytes", 413)
        if not signature_matches(settings.secret, delivery_id, timestamp, body, signature):
            return refuse("bad signature")
        if not seen.claim(delivery_id, now):
            return refuse("replayed delivery id")
        try:   # the one bounded JSON parser: a 50,000-deep body is a 400, not a RecursionError
            event = parse_json(body, "payload", "", max_depth=MAX_JSON_DEPTH, finite=True)
            wanted = release_request(event, delivery_id, settings)
        except (InputError, ValueError, UnicodeDecodeError) as exc:  # MalformedPayload is a ValueError
            return JSONResponse({"accepted": True, "action": "ignored", "reason": f"unreadable payload: {exc}"},
                                status_code=400)
        except Exception as exc:  # the registry lookup of a tag event's run failed: MLflow retries on 502
            seen.release(delivery_id)
            return JSONResponse({"accepted": True, "action": "failed", "reason": f"cannot look up the run: {exc}"},
                                status_code=502)
        if isinstance(wanted, str):
            return JSONResponse({"accepted": True, "action": "ignored", "reason": wanted})
        key = (wanted.model, wanted.version)
        with started_lock:
            if key in settings.started:
                return JSONResponse({"accepted": True, "action": "already started", "started": settings.started[key]})
            settings.started[key] = "starting"
        try:
            how = settings.trigger(wanted)
        except Exception as exc:  # reported to MLflow as 502, so it retries the delivery
            with started_lock:
                settings.started.pop(key, None)
            seen.release(delivery_id)
            return JSONResponse({"accepted": True, "action": "failed", "reason": str(exc)}, status_code=502)
        settings.started[key] = how
        return JSONResponse({"accepted": True, "action": "started", "started": how, "model": wanted.model,
                             "version": wanted.version, "run_id": wanted.run_id}, status_code=202)

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/", receive, methods=["POST"]), Route("/webhook", receive, methods=["POST"]),
                             Route("/health", health, methods=["GET"])])


def _field(data: dict[str, Any], key: str, *kinds: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise MalformedPayload(f"data.{key} is {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}")
    return value


def release_request(event: object, delivery_id: str, settings: WebhookSettings) -> ReleaseRequest | str:
    """The release a delivery asks for, or why it asks for none; MalformedPayload for a payload of the
    wrong shape. The model name, version and run id that reach a command line are checked strictly."""
    if not isinstance(event, dict):
        raise MalformedPayload("the payload is not a JSON object")
    entity, action, data = event.get("entity"), event.get("action"), event.get("data")
    if not isinstance(entity, str) or not isinstance(action, str) or not isinstance(data, dict):
        raise MalformedPayload("entity, action and data are missing or of the wrong type")
    kind = f"{entity}.{action}"
    if kind == "model_version.created":
        tags = data.get("tags") or {}
        if not isinstance(tags, dict):
            raise MalformedPayload("data.tags is not an object")
        if tags.get(settings.release_tag) != settings.release_value:
            return f"{kind}: not tagged {settings.release_tag}={settings.release_value}"
    elif kind == "model_version_tag.set":
        key, value = _field(data, "key", str), _field(data, "value", str)
        if key != settings.release_tag or value != settings.release_value:
            return f"{kind}: tag {key}={value} is not the release tag"
    else:
        return f"{kind}: not a release event"
    name, version = _field(data, "name", str), str(_field(data, "version", str, int))
    if bad_model_name(name) is not None or not VERSION.fullmatch(version):
        return f"{name!r} v{version!r} is not a model version relctl can release"
    run_id = data.get("run_id") if kind == "model_version.created" else settings.version_run(name, version)
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        return f"{name} v{version} has no source run to promote (run id {run_id!r})"
    return ReleaseRequest(model=name, version=version, run_id=run_id, delivery_id=delivery_id)
