"""What the router learns from an answer as it passes through: first/last token times, tokens, text.

It only reads the bytes it forwards (never holds a chunk back): SSE lines are split out of the raw
chunks for parsing, the chunks themselves go on to the client untouched.
"""

from __future__ import annotations

import json
import time
from typing import Any

from release.serving.loadgen.client import sse_event
from release.serving.router.records import RouterRecord


class Tally:
    """Times and counts one answer; `stream` says whether the body is SSE (else one JSON document)."""

    def __init__(self, sent: float, keep_text: bool) -> None:
        self.sent = sent
        self.keep_text = keep_text
        self.stream = True
        self.first: float | None = None
        self.last: float | None = None
        self.itl: list[float] = []
        self.chunks = 0
        # Chunks with a choice but no visible text (a token that decodes to nothing yet, e.g. half of a
        # UTF-8 character): the answer's timing when no chunk had text at all.
        self.silent: list[float] = []
        self.finished_at: float | None = None   # the chunk that carried finish_reason
        self.end_only = False
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.pieces: list[str] = []
        self.status: str | None = None
        self.error: str | None = None
        self._pending = b""
        self._body: list[bytes] = []

    def feed(self, chunk: bytes, now: float) -> None:
        if not self.stream:
            self._body.append(chunk)
            return
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            self._line(line.strip(), now)

    def _line(self, line: bytes, now: float) -> None:
        event = None if self.status is not None else sse_event(line)
        if event is None:
            return
        if "error" in event:
            self.fail("stream_error", str(event["error"])[:300])
            return
        usage = event.get("usage")
        if usage:
            self.usage_tokens = usage.get("completion_tokens")
            self.prompt_tokens = usage.get("prompt_tokens")
        text = _text(event, "delta")
        if not text and _token_chunk(event):
            self.silent.append(now)
        if _finish_chunk(event):
            self.finished_at = now
        if text:
            self.chunks += 1
            if self.last is None:
                self.first = now
            else:
                self.itl.append(now - self.last)
            self.last = now
            if self.keep_text:
                self.pieces.append(text)

    def fail(self, kind: str, message: str) -> None:
        if self.status is None or self.status == "ok":
            self.status, self.error = kind, message

    def finish(self, http_status: int) -> None:
        now = time.perf_counter()
        if self.status is not None:
            return
        if http_status != 200:
            body = b"".join(self._body) + self._pending
            self.fail("http_429" if http_status == 429 else "http_5xx" if http_status >= 500 else "http_4xx",
                      body.decode(errors="replace")[:300])
            return
        if self.stream:
            if self._pending.strip():
                self._line(self._pending.strip(), now)
            if self.status is None and self.last is None and (self.usage_tokens or 0) > 0:
                if self.silent:
                    self.first, self.last = self.silent[0], self.silent[-1]
                    self.chunks = len(self.silent)
                elif self.finished_at is not None:
                    # Tokens that all decoded to nothing were never streamed: only the end is known.
                    self.last, self.end_only = self.finished_at, True
            if self.status is None and self.last is None:
                self.fail("empty", "stream ended without any token")
            self.status = self.status or "ok"
            return
        document = json.loads(b"".join(self._body))
        usage = document.get("usage") or {}
        self.usage_tokens = int(usage.get("completion_tokens", 0))
        self.prompt_tokens = usage.get("prompt_tokens")
        # Without streaming only the end is observable: TTFT and TPOT stay unknown.
        self.last = now
        if self.keep_text:
            self.pieces.append(_text(document, "message"))
        self.status = "ok"

    def apply(self, rec: RouterRecord) -> None:
        """Write what was learned into the record (times relative to the send, as the load generator's)."""
        rec.status = self.status or "disconnect"
        rec.error = self.error
        wall = rec.sent_at - self.sent
        if rec.status == "ok":
            rec.output_tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
            rec.prompt_tokens = self.prompt_tokens
            rec.itl_s = self.itl
            if self.first is not None and not self.end_only:
                rec.ttft_s = self.first - self.sent
                rec.first_token_at = self.first + wall
            if self.last is not None:
                rec.e2el_s = self.last - self.sent
                rec.last_token_at = self.last + wall
            if rec.ttft_s is not None and rec.e2el_s is not None and rec.output_tokens > 1:
                rec.tpot_s = (rec.e2el_s - rec.ttft_s) / (rec.output_tokens - 1)
        if self.keep_text:
            rec.text = "".join(self.pieces)


def _token_chunk(event: dict[str, Any]) -> bool:
    choices = event.get("choices") or []
    return bool(choices) and choices[0].get("finish_reason") is None


def _finish_chunk(event: dict[str, Any]) -> bool:
    choices = event.get("choices") or []
    return bool(choices) and choices[0].get("finish_reason") is not None


def _text(event: dict[str, Any], key: str) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if key in choice:
        return str((choice[key] or {}).get("content") or "")
    return str(choice.get("text") or "")
