"""Replayed traces: arrival times and request lengths from the formats real traffic is recorded in.

Detected from the file's first row:
    relctl trace   JSONL {"timestamp": s, "prompt"|"messages": ..., "output_tokens": n}
    Mooncake       JSONL {"timestamp": ms, "input_length": n, "output_length": n, ...}
    request log    JSONL of `relctl serve` (requestlog.py): {"time": ISO end time, "latency_s",
                   "prompt_tokens", "output_tokens", ...}; content may be redacted or hashed, so only
                   times and lengths are replayed
    records        JSONL of relctl bench or the canary router: {"index", "scheduled_s",
                   "expected_output_tokens", "prompt_tokens", ...}; the router's mirrored copies skipped
    Azure          CSV with a header TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM inference traces)
Rows that give only lengths get a synthetic prompt of that many common words (about one token each).
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from release.core.errors import InputError
from release.core.jsonfile import parse_json

FORMATS_HINT = ("known formats: relctl trace JSONL (timestamp + prompt), Mooncake JSONL (timestamp, input_length, "
                "output_length), relctl serve request log, relctl bench/router records JSONL, Azure CSV "
                "(TIMESTAMP, ContextTokens, GeneratedTokens)")


@dataclass(frozen=True)
class Trace:
    """A replayed trace: send offsets (seconds from the first row) and each row's fields, normalized:
    rows carry either `prompt`/`messages` or `input_tokens`, and `output_tokens` when known."""

    offsets: np.ndarray
    rows: list[dict[str, Any]]
    format: str = "relctl"

    @property
    def rate(self) -> float:
        span = float(self.offsets[-1] - self.offsets[0])
        return (len(self.offsets) - 1) / span if span > 0 else float("inf")


def load_trace(path: Path) -> Trace:
    """Read a trace in any known format (see the module docstring); rows sorted by time."""
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="check the path")
    text = path.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InputError(f"{path.name}: empty trace", hint=FORMATS_HINT)
    if lines[0].lstrip().startswith("{"):
        rows = [_json_row(path, n, line) for n, line in enumerate(lines, start=1)]
        name, convert = _jsonl_format(rows[0])
        if name == "relctl" and "timestamp" not in rows[0]:
            raise InputError(f"{path.name}: line 1 has no numeric 'timestamp' and matches no known trace format",
                             hint=FORMATS_HINT)
        converted = [convert(row, f"{path.name}: line {n}") for n, row in enumerate(rows, start=1)]
        stamped = [pair for pair in converted if pair is not None]
    else:
        name, stamped = "azure", _azure(path, text)
    if len(stamped) < 2:
        raise InputError(f"{path.name}: a trace needs at least 2 rows", hint="record more requests")
    stamped.sort(key=lambda pair: pair[0])
    stamps = np.array([t for t, _ in stamped])
    return Trace(stamps - stamps[0], [row for _, row in stamped], name)


def scale_trace(trace: Trace, rate: float | None) -> np.ndarray:
    """The trace's offsets, compressed or stretched to `rate` (None: as recorded)."""
    if rate is None:
        return trace.offsets
    if rate <= 0:
        raise InputError(f"rate {rate}: must be positive", hint="omit --rate to replay the trace as recorded")
    return trace.offsets * (trace.rate / rate)


Converter = Callable[[dict[str, Any], str], tuple[float, dict[str, Any]] | None]


def _jsonl_format(first: dict[str, Any]) -> tuple[str, Converter]:
    if "scheduled_s" in first and "index" in first:
        return "records", _record
    if "input_length" in first:
        return "mooncake", _mooncake
    if "time" in first and "latency_s" in first:
        return "requestlog", _requestlog
    return "relctl", _relctl


def _relctl(row: dict[str, Any], where: str) -> tuple[float, dict[str, Any]]:
    return _number(row, "timestamp", where, 'rows look like {"timestamp": 0.25, "prompt": "...", "output_tokens": 64}; '
                   + FORMATS_HINT), row


def _mooncake(row: dict[str, Any], where: str) -> tuple[float, dict[str, Any]]:
    hint = 'Mooncake rows look like {"timestamp": 27482, "input_length": 6955, "output_length": 52}'
    stamp = _number(row, "timestamp", where, hint) / 1000.0  # Mooncake's timestamps are milliseconds
    return stamp, {"input_tokens": _count(row, "input_length", where, hint),
                   "output_tokens": _count(row, "output_length", where, hint)}


def _requestlog(row: dict[str, Any], where: str) -> tuple[float, dict[str, Any]]:
    hint = "a relctl serve request log line has time (ISO 8601), latency_s, prompt_tokens and output_tokens"
    try:
        end = dt.datetime.fromisoformat(str(row["time"]))
    except (KeyError, ValueError) as exc:
        raise InputError(f"{where}: 'time' is not an ISO 8601 time", hint=hint) from exc
    # The log is written when a request ends; it arrived latency_s earlier.
    arrived = end.timestamp() - _number(row, "latency_s", where, hint)
    return arrived, {"input_tokens": _count(row, "prompt_tokens", where, hint, default=1),
                     "output_tokens": _count(row, "output_tokens", where, hint, default=None)}


def _record(row: dict[str, Any], where: str) -> tuple[float, dict[str, Any]] | None:
    hint = "bench records carry index, scheduled_s, expected_output_tokens and prompt_tokens"
    if row.get("mirrored"):
        return None  # the router's shadow copy of a request that is in the file already
    out = _count(row, "expected_output_tokens", where, hint, default=None) or _count(
        row, "output_tokens", where, hint, default=None)
    return _number(row, "scheduled_s", where, hint), {
        "input_tokens": _count(row, "prompt_tokens", where, hint, default=None), "output_tokens": out}


def _azure(path: Path, text: str) -> list[tuple[float, dict[str, Any]]]:
    reader = csv.DictReader(text.splitlines())
    fields = {name.strip(): name for name in reader.fieldnames or []}
    if not {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= set(fields):
        raise InputError(f"{path.name}: not a known trace format (first line: {text.splitlines()[0][:60]!r})",
                         hint=FORMATS_HINT)
    hint = "Azure trace rows: TIMESTAMP (e.g. 2023-11-16 18:15:46.6805900), ContextTokens, GeneratedTokens"
    out = []
    for number, row in enumerate(reader, start=2):
        where = f"{path.name}: line {number}"
        clean = {key: row.get(name) for key, name in fields.items()}
        out.append((_azure_time(str(clean["TIMESTAMP"]), where, hint),
                    {"input_tokens": _count(clean, "ContextTokens", where, hint),
                     "output_tokens": _count(clean, "GeneratedTokens", where, hint)}))
    return out


def _azure_time(value: str, where: str, hint: str) -> float:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    # Azure writes 7 fractional digits (.NET ticks); datetime takes at most 6.
    head, dot, frac = value.partition(".")
    try:
        stamp = dt.datetime.fromisoformat(head)
    except ValueError as exc:
        raise InputError(f"{where}: TIMESTAMP {value!r} is not a time", hint=hint) from exc
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    digits = "".join(ch for ch in frac if ch.isdigit()) if dot else ""
    return stamp.timestamp() + (float(f"0.{digits}") if digits else 0.0)


def _number(row: dict[str, Any], key: str, where: str, hint: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where} has no numeric '{key}'", hint=hint)
    return float(value)


def _count(row: dict[str, Any], key: str, where: str, hint: str, default: int | str | None = "required"
           ) -> Any:
    value = row.get(key)
    if value is None or value == "":
        if default == "required":
            raise InputError(f"{where} has no '{key}'", hint=hint)
        return default
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: '{key}' is not a whole number ({str(value)[:20]!r})", hint=hint) from exc
    if number < 0:
        raise InputError(f"{where}: '{key}' is negative", hint=hint)
    return number


def _json_row(path: Path, number: int, line: str) -> dict[str, Any]:
    row = parse_json(line, f"{path.name}: line {number}", hint="one JSON object per line", finite=True)
    if not isinstance(row, dict):
        raise InputError(f"{path.name}: line {number} is not a JSON object", hint=FORMATS_HINT)
    return row
