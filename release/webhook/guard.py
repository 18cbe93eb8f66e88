"""The receiver's connection limits, below the app: slow or huge clients cannot hold it.

uvicorn bounds neither the time a client takes to send its headers nor the number of connections it
keeps open, and its default parser (httptools) buffers a header line of any length. `guarded_protocol`
is uvicorn's h11 protocol with:
- header bytes bounded (h11's incomplete-event limit, `max_header_bytes`): a longer header is a 400;
- header time bounded: a connection whose request headers are not complete `header_timeout_s` after it
  opened (or after its previous response) is closed;
- open connections bounded (`max_connections`): past the limit, the connection that has waited longest
  for its headers is closed to make room, so a crowd of slow clients cannot starve health checks and
  signed deliveries (which send their headers at once and are never the oldest waiting).
The body's own size and time limits are the app's (release.webhook.receiver).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 16 * 1024
    header_timeout_s: float = 10.0
    max_connections: int = 64


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """An H11Protocol class enforcing `limits` (uvicorn instantiates it per connection)."""

    waiting: dict[Any, float] = {}   # connections still sending request headers -> since when

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_headers()
            if len(self.connections) > limits.max_connections:
                # Make room: the longest-waiting slow client goes (never one with a request in progress).
                oldest = min(waiting, key=waiting.__getitem__, default=None)
                if oldest is not None:
                    oldest._close()

        def _await_headers(self) -> None:
            waiting[self] = self.loop.time()
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            if self in waiting:
                self._close()

        def _close(self) -> None:
            waiting.pop(self, None)
            if not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete and self in waiting:
                waiting.pop(self, None)   # headers complete: the request is the app's now
                if self._header_timer is not None:
                    self._header_timer.cancel()

        def on_response_complete(self) -> None:
            super().on_response_complete()   # may start a pipelined request at once
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._await_headers()   # a kept-alive connection waits for its next request's headers

        def connection_lost(self, exc: Exception | None) -> None:
            waiting.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

    return GuardedH11Protocol
