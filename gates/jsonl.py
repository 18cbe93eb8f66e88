"""Reading JSONL data files (eval sets, safety suites) with line numbers kept for error messages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.core.errors import InputError


@dataclass(frozen=True)
class Record:
    line: int
    data: dict[str, Any]


def read_jsonl(path: Path, what: str) -> list[Record]:
    """Every non-blank line of `path` as a JSON object; `what` names the file's role in errors."""
    if not path.is_file():
        raise InputError(f"{path}: no such {what}", hint=f"check the path of the {what}")
    records: list[Record] = []
    with path.open(encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                data = json.loads(text.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"{path.name}: line {number}: not valid JSON ({exc.msg} at column {exc.colno})",
                    hint="each line must be one complete JSON object",
                ) from exc
            if not isinstance(data, dict):
                raise InputError(
                    f"{path.name}: line {number}: expected a JSON object, got {type(data).__name__}",
                    hint='write one object per line, e.g. {"prompt": "...", "expected": "..."}',
                )
            records.append(Record(line=number, data=data))
    return records
