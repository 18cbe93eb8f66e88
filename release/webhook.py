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

# The header names are MLflow's own constants, so a rename there breaks here loudly.
from mlflow.webhooks.constants import (
    WEBHOOK_DELIVERY_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_SIGNATURE_VERSION,
    WEBHOOK_TIMESTAMP_HEADER,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
Trigger = Callable[["ReleaseRequest"], str]


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
        if path.is_file():
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                self.seen[entry["id"]] = float(entry["at"])

    def claim(self, delivery_id: str, now: float) -> bool:
        """Record `delivery_id`; False when it was already recorded (a replay)."""
        with self.lock:
            self.seen = {d: t for d, t in self.seen.items() if now - t <= 2 * self.window_s}
            if delivery_id in self.seen:
                return False
            self.seen[delivery_id] = now
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("".join(json.dumps({"id": d, "at": t}) + "\n" for d, t in self.seen.items()))
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
    clock: Callable[[], float] = time.time
    started: dict[tuple[str, str], str] = field(default_factory=dict)


def create_app(settings: WebhookSettings) -> Starlette:
    """The receiver: POST / (and /webhook) take MLflow deliveries; GET /health answers 200."""
    seen = SeenDeliveries(settings.state_dir / "webhook-deliveries.jsonl", settings.max_age_s)
    started_lock = threading.Lock()

    def refuse(reason: str) -> JSONResponse:
        return JSONResponse({"accepted": False, "reason": reason}, status_code=401)

    async def receive(request: Request) -> JSONResponse:
        body = await request.body()
        delivery_id = request.headers.get(WEBHOOK_DELIVERY_ID_HEADER, "")
        timestamp = request.headers.get(WEBHOOK_TIMESTAMP_HEADER, "")
        signature = request.headers.get(WEBHOOK_SIGNATURE_HEADER, "")
        if not (delivery_id and timestamp and signature):
            return refuse(f"missing {WEBHOOK_DELIVERY_ID_HEADER}, {WEBHOOK_TIMESTAMP_HEADER} or "
                          f"{WEBHOOK_SIGNATURE_HEADER}")
        if not signature_matches(settings.secret, delivery_id, timestamp, body, signature):
            return refuse("bad signature")
        now = settings.clock()
        try:
            age = now - int(timestamp)
        except ValueError:
            return refuse("timestamp is not unix seconds")
        if abs(age) > settings.max_age_s:
            return refuse(f"stale timestamp: {age:.0f}s old, the window is {settings.max_age_s:.0f}s")
        if not seen.claim(delivery_id, now):
            return refuse("replayed delivery id")
        try:
            event = json.loads(body)
            wanted = release_request(event, delivery_id, settings)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"accepted": True, "action": "ignored", "reason": f"unreadable payload: {exc}"},
                                status_code=400)
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


def release_request(event: dict[str, Any], delivery_id: str, settings: WebhookSettings) -> ReleaseRequest | str:
    """The release a delivery asks for, or why it asks for none."""
    kind = f"{event['entity']}.{event['action']}"
    data = event["data"]
    if kind == "model_version.created":
        if (data.get("tags") or {}).get(settings.release_tag) != settings.release_value:
            return f"{kind}: not tagged {settings.release_tag}={settings.release_value}"
        run_id = data.get("run_id")
    elif kind == "model_version_tag.set":
        if data["key"] != settings.release_tag or data["value"] != settings.release_value:
            return f"{kind}: tag {data['key']}={data['value']} is not the release tag"
        run_id = settings.version_run(str(data["name"]), str(data["version"]))
    else:
        return f"{kind}: not a release event"
    if not run_id or not RUN_ID.match(str(run_id)):
        return f"{data['name']} v{data['version']} has no source run to promote"
    return ReleaseRequest(model=str(data["name"]), version=str(data["version"]), run_id=str(run_id),
                          delivery_id=delivery_id)
