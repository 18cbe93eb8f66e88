"""Forwarding one admitted request to an engine that is its own HTTP server and streams server-sent events
(vLLM's /v1/completions, llama-server's /completion): the deadline, cancellation, stop strings and the token
count are relctl's, the same for every such engine; only the chunk's shape is the engine's (`read`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from release.backends.jobs import Job, StopMatcher, emit_text

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class Chunk:
    """What one streamed event says, in relctl's terms."""

    text: str = ""
    token: bool = False         # it carries one generated token (counted until the engine gives its own count)
    finish: str | None = None   # "stop" or "length" when the engine ended the generation here
    count: int | None = None    # the engine's own count of generated tokens, when it states it
    last: bool = False          # nothing after it matters (the engine's final event)


def forward(http: httpx.Client, path: str, body: dict[str, Any], job: Job, engine: str,
            read: Callable[[dict[str, Any]], list[Chunk]]) -> tuple[str, int]:
    """Stream `body` to the engine's `path` and emit the text to `job`; (finish reason, output tokens)."""
    stops = StopMatcher(job.params.stop)
    finish, count = "length", 0
    remaining = max(0.1, job.deadline - time.monotonic())
    # Leaving the `with` closes the connection, which cancels the request inside the engine (stop string,
    # client gone, deadline): no generation outlives its request.
    with http.stream("POST", path, json=body, timeout=remaining) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{engine}: HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if job.cancel.is_set() or time.monotonic() >= job.deadline:
                return "timeout", count
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for chunk in read(json.loads(line[6:])):
                count += chunk.token
                out, stopped = stops.feed(chunk.text)
                emit_text(job, out)
                if stopped:
                    return "stop", count
                count = count if chunk.count is None else chunk.count
                finish = chunk.finish or finish
                if chunk.last:
                    emit_text(job, stops.flush())
                    return finish, count
    emit_text(job, stops.flush())
    return finish, count
