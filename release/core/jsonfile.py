"""Reading the small JSON files a checkpoint, adapter or converted model must have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from release.core.errors import InputError


def read_json_file(path: Path, missing: InputError, fix_hint: str) -> Any:
    """The parsed file; `missing` when it does not exist, an InputError naming the line when it is not JSON."""
    if not path.is_file():
        raise missing
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name}: invalid JSON at line {exc.lineno}", hint=fix_hint) from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name}: not UTF-8 text", hint=fix_hint) from exc
