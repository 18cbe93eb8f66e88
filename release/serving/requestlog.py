"""Request/response log under a retention policy: off by default; when on, one JSONL file per day,
content redacted, hashed, kept in full or left out, and files older than the retention deleted."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

from release.core.server_settings import RequestLogPolicy

# Order matters: keys before numbers, so a key's digits are not redacted piecemeal first.
REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"), "[EMAIL]"),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}\b"), "[KEY]"),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "[KEY]"),
    (re.compile(r"\b(?:ghp|gho|ghs|github_pat|xox[abpr])_?[A-Za-z0-9_-]{16,}\b"), "[KEY]"),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"), "Bearer [KEY]"),
    (re.compile(r"\b[A-Fa-f0-9]{32,}\b"), "[KEY]"),
    (re.compile(r"\b[A-Za-z0-9+/_-]*\d[A-Za-z0-9+/_-]*[A-Za-z][A-Za-z0-9+/_-]{30,}\b"), "[KEY]"),
    (re.compile(r"\+?\d[\d .()/-]*\d|\d"), "[NUMBER]"),
)


def redact(text: str) -> str:
    """Replace emails, keys and tokens, and numbers (phone, card, account, any digits) by placeholders."""
    for pattern, placeholder in REDACTIONS:
        text = pattern.sub(placeholder, text)
    return text


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class RequestLog:
    """Appends one line per request; thread-safe; a no-op when the policy is off."""

    def __init__(self, policy: RequestLogPolicy, directory: Path) -> None:
        self.policy = policy
        self.directory = directory
        self._lock = threading.Lock()
        self._day: dt.date | None = None

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    def keep(self, text: str) -> str | None:
        """Text as the policy allows it to be stored."""
        mode = self.policy.content
        if mode == "full":
            return text
        if mode == "redact":
            return redact(text)
        if mode == "hash":
            return digest(text)
        return None

    def write(self, record: dict[str, Any], prompt: str, output: str, now: dt.datetime | None = None) -> None:
        if not self.policy.enabled:
            return
        now = now or dt.datetime.now(dt.UTC)
        line = {"time": now.isoformat(), **record, "prompt": self.keep(prompt), "output": self.keep(output)}
        with self._lock:
            if self._day != now.date():
                self.directory.mkdir(parents=True, exist_ok=True)
                self.purge(now.date())
                self._day = now.date()
            with (self.directory / f"requests-{now.date().isoformat()}.jsonl").open("a") as fh:
                fh.write(json.dumps(line, separators=(",", ":")) + "\n")

    def purge(self, today: dt.date) -> list[Path]:
        """Delete day files older than the retention; returns what was deleted."""
        oldest = today - dt.timedelta(days=self.policy.retention_days - 1)
        removed = []
        for path in sorted(self.directory.glob("requests-*.jsonl")):
            try:
                day = dt.date.fromisoformat(path.stem.removeprefix("requests-"))
            except ValueError:
                continue
            if day < oldest:
                path.unlink()
                removed.append(path)
        return removed
