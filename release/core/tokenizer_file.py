"""tokenizer.json read for the `tokenizers` library: bounded in size before the Rust parser sees it.

`Tokenizer.from_file` reads and parses a file of any size (a multi-GB tokenizer.json is held whole, twice,
before any error). Every tokenizer relctl loads goes through `load_tokenizer`: the file is read once, up to
`MAX_TOKENIZER_BYTES` (real ones are 2-35 MB), checked to be UTF-8, and parsed from that text; every defect
is one InputError (exit 2) naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from release.core.errors import InputError
from release.core.jsonfile import read_bounded

MAX_TOKENIZER_BYTES = 128 * 1024 * 1024   # Gemma's 262k-token vocabulary is ~33 MB; four times that is refused
HINT = "save the training tokenizer with tokenizer.save_pretrained(dir)"


def load_tokenizer(path: Path, label: str | None = None, max_bytes: int = MAX_TOKENIZER_BYTES) -> Any:
    """The `tokenizers.Tokenizer` in `path`, or InputError `label: ...` (bounded size, UTF-8, loadable)."""
    from tokenizers import Tokenizer  # noqa: PLC0415 - the Rust extension only where a tokenizer is read

    name = label or f"{path.parent.name}/{path.name}"
    if not path.is_file():
        raise InputError(f"{name}: no such file", hint=HINT)
    raw = read_bounded(path, name, HINT, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (byte {exc.start})", hint=HINT) from exc
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the Rust parser raises plain Exception for every defect
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"{name}: not a tokenizer the tokenizers library can load ({first})", hint=HINT) from exc
