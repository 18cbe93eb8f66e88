"""The one client of a running server's /admin paths (release/serving/admin.py): what `relctl rollback ADAPTER
--server`, the adapter canary and anything else that switches adapters on a live base send, with the admin
key (`RELCTL_ADMIN_KEY`, never the completions key).

Every failure is an AdminError naming the server, the path and what came back: no key, no answer, a refusal
(its HTTP status and the server's own one-line reason), or an answer that is not the server's JSON (a proxy's
HTML page). Callers decide what a failure means for them (a rollback after its alias moved says so).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from release.core.errors import InputError, StageFailed

ADMIN_KEY_ENV = "RELCTL_ADMIN_KEY"
TIMEOUT_S = 300.0  # a load fetches and verifies the package, then the engine loads it


class AdminError(StageFailed):
    """The server did not do what was asked. `status`: its HTTP status (None: no answer at all); `reason`: what
    came back (the server's own message, or the start of an answer that is not its JSON, with its content
    type), without the server and path the message leads with."""

    def __init__(self, message: str, hint: str | None = None, status: int | None = None, reason: str = "") -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.reason = reason or message


def admin_key(given: str | None = None, what: str = "--server") -> str:
    """The admin key: `given`, else RELCTL_ADMIN_KEY; InputError (exit 2) before anything is sent or moved."""
    key = given if given is not None else os.environ.get(ADMIN_KEY_ENV)
    if not key:
        raise InputError(f"{what}: switching adapters on the server needs its admin key",
                         hint=f"set {ADMIN_KEY_ENV} to the key the server was started with (--admin-key)")
    return key


@dataclass(frozen=True)
class AdminClient:
    """One base server's admin paths. `url`: the server's root (a trailing /v1 is dropped)."""

    url: str
    key: str
    timeout_s: float = TIMEOUT_S

    @classmethod
    def of(cls, url: str, key: str | None = None, what: str = "--server", timeout_s: float = TIMEOUT_S
           ) -> AdminClient:
        """The client of the server at `url` with `key`, else RELCTL_ADMIN_KEY (InputError when neither)."""
        return cls(url.rstrip("/").removesuffix("/v1"), admin_key(key, what), timeout_s)

    def listing(self) -> dict[str, Any]:
        """GET /admin/adapters: {"base": ..., "adapters": [...], "draining": {...}}. An answer of another shape
        (`{"adapters": 5}`: a proxy, another server) is an AdminError naming the field, never a crash of a
        caller iterating it."""
        answer = self._call("GET", "/admin/adapters", None)
        adapters = answer.get("adapters")
        problem = None
        if not isinstance(adapters, list):
            problem = f"'adapters' is {type(adapters).__name__ if 'adapters' in answer else 'missing'}, not a list"
        elif not all(isinstance(e, dict) for e in adapters):
            problem = "an entry of 'adapters' is not an object"
        elif not isinstance(answer.get("base"), dict | None):
            problem = f"'base' is {type(answer.get('base')).__name__}, not an object"
        if problem:
            reason = f"not relctl serve's adapter listing: {problem}"
            raise AdminError(f"--server {self.url}/admin/adapters: {reason}",
                             hint="point --server at relctl serve BASE@production --adapters", status=200,
                             reason=reason)
        return answer

    def switch(self, model: str, version: str | None = None) -> dict[str, Any]:
        """Serve `model` at `version` (None: its production); the answer plus `round_trip_s`."""
        return self._call("POST", "/admin/adapters", {"model": model, **({"version": version} if version else {})})

    def pin(self, served_name: str) -> dict[str, Any]:
        """Serve MODEL:VERSION beside MODEL (a canary's candidate arm)."""
        return self._call("POST", "/admin/adapters", {"model": served_name})

    def unload(self, served_name: str) -> dict[str, Any]:
        return self._call("POST", "/admin/adapters/unload", {"model": served_name})

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        import httpx  # noqa: PLC0415 - only a command that talks to a server pays for it

        where = f"--server {self.url}{path}"
        started = time.monotonic()
        try:
            response = httpx.request(method, self.url + path, json=body, timeout=self.timeout_s,
                                     headers={"Authorization": f"Bearer {self.key}"})
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise AdminError(f"{where}: {reason}", hint="is relctl serve BASE@production --adapters running there?",
                             reason=reason) from exc
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code != 200 or not isinstance(answer, dict):
            reason = _reason(answer, response.text, response.headers.get("content-type", ""))
            raise AdminError(f"{where}: HTTP {response.status_code}: {reason}", hint=_hint(response.status_code),
                             status=response.status_code, reason=reason)
        answer["round_trip_s"] = round(time.monotonic() - started, 3)
        return answer


def _reason(answer: Any, text: str, content_type: str) -> str:
    """The server's own message (relctl's error body), else the start of whatever came back, on one line, with
    its content type (a proxy's or a login page's HTML is told apart at a glance)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    kind = content_type.split(";")[0].strip() or "no content type"
    return f"{kind}: {' '.join(text.split())[:200] or '(empty answer)'}"


def _hint(status: int) -> str:
    if status == 401:
        return f"set {ADMIN_KEY_ENV} to the admin key the server was started with (--admin-key)"
    if status == 403:
        return f"start the server with --admin-key and send that key ({ADMIN_KEY_ENV}), not a completions key"
    if status == 404:
        return "start the server with relctl serve BASE@production --adapters"
    return "GET /admin/adapters shows what the server serves"
