"""Who may call what on `relctl serve`: two credentials, two scopes (docs/serving.md, docs/adapters.md §5)."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from release.serving.admin import ADMIN_PREFIX
from release.serving.metrics import ServerMetrics
from release.serving.protocol import RequestProblem


class KeyAuth:
    """Two credentials, two scopes. /admin/* (what the server serves: adapter switches) takes the admin key
    alone: a server started without one refuses the admin paths (403), a completions key there is 403, any
    other credential 401. Every other path but /health (probes carry no credentials) takes the completions
    key when the server has one (401 otherwise; the admin key is not a completions key: 403). Keys are
    compared in constant time, so response timing does not reveal how much of a guess matched."""

    OPEN = frozenset({"/health"})

    def __init__(self, app: ASGIApp, api_key: str | None, admin_key: str | None, metrics: ServerMetrics) -> None:
        self.app = app
        self.api = f"Bearer {api_key}".encode() if api_key is not None else None
        self.admin = f"Bearer {admin_key}".encode() if admin_key is not None else None
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope["path"], dict(scope["headers"]).get(b"authorization", b""))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        self.metrics.rejected.labels("unauthorized" if status == 401 else "forbidden").inc()
        headers = {"WWW-Authenticate": 'Bearer realm="relctl"'} if status == 401 else None
        response = JSONResponse(RequestProblem("authorization", message, status=status).body(), status_code=status,
                                headers=headers)
        await response(scope, receive, send)

    def refusal(self, path: str, given: bytes) -> tuple[int, str] | None:
        """(status, why) when `given` (the Authorization header) may not call `path`; None when it may."""
        is_api = self.api is not None and hmac.compare_digest(given, self.api)
        is_admin = self.admin is not None and hmac.compare_digest(given, self.admin)
        if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
            if is_admin:
                return None
            if self.admin is None:
                return 403, "admin paths need the server started with --admin-key (RELCTL_ADMIN_KEY)"
            if is_api:
                return 403, "a completions key cannot change what this server serves: send the admin key"
            return 401, "missing or wrong admin key: send 'Authorization: Bearer <admin key>'"
        if self.api is None or is_api:
            return None
        if is_admin:
            return 403, "the admin key opens /admin only: send a completions key (--api-key)"
        return 401, "missing or wrong API key: send 'Authorization: Bearer <key>'"
