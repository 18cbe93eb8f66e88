"""The one loader for the JSON and YAML files relctl reads (release.yaml, config.json, tokenizer files,
package manifests, approvals, state files), and for JSON that arrives over the network.

`json.loads` and `yaml.safe_load` alone are not safe on hostile input: deep nesting recurses until
RecursionError (a bug, exit 3), a huge file is read whole, a duplicated key silently keeps the last value,
and NaN/Infinity are accepted. Here each of these is an InputError (exit 2), one line naming the file
and, where there is one, the field: a depth bound, a size bound, duplicate keys refused, and `expect`
checks that a value has the JSON type the reader needs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from release.core.errors import InputError

MAX_DEPTH = 64   # the deepest file relctl reads (tokenizer.json, an OCI manifest) nests fewer than 10 levels
MAX_FILE_BYTES = 256 * 1024 * 1024   # a tokenizer.json is a few MB; a manifest of a 10k-file package ~1 MB
MAX_CONFIG_BYTES = 4 * 1024 * 1024   # release.yaml, job files, approvals: hand-written, a few KB
# Strings and escapes removed, what is left holds only structure; a bracket inside a string cannot count.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def nesting_depth(raw: bytes) -> int:
    """Deepest bracket nesting of a JSON text (strings ignored): two regex passes in C, no recursion. The one
    depth check for files (parse_json) and request bodies (release/serving/parsing.py)."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub(b"", raw)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes | str, label: str, hint: str, max_depth: int = MAX_DEPTH, finite: bool = False) -> Any:
    """`raw` decoded, or InputError `label: ...` for text that is not bounded, valid, duplicate-free JSON.
    `finite`: NaN and Infinity refused too (Python's json writes them, so files a library saved may hold
    them: there the reader's field check names the field instead)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = nesting_depth(data)
    if depth > max_depth:
        raise InputError(f"{label}: JSON nested {depth} levels deep; at most {max_depth} are read", hint=hint)
    try:
        return json.loads(data, object_pairs_hook=_pairs, parse_constant=_constant if finite else None)
    except _Duplicate as exc:
        raise InputError(f"{label}: key '{exc}' appears twice in one object", hint=hint) from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{label}: not UTF-8 text (byte {exc.start})", hint=hint) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{label}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                         hint=hint) from exc
    except (ValueError, RecursionError) as exc:   # NaN, an integer past Python's digit limit
        raise InputError(f"{label}: invalid JSON: {exc}", hint=hint) from exc


def read_bounded(path: Path, label: str, hint: str, max_bytes: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(f"{label}: {size} bytes; at most {max_bytes} are read", hint=hint)
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)   # the file may have grown since stat
    except OSError as exc:
        raise InputError(f"{label}: cannot be read: {exc.strerror}", hint=hint) from exc
    if len(data) > max_bytes:
        raise InputError(f"{label}: more than {max_bytes} bytes; at most {max_bytes} are read", hint=hint)
    return data


def load_json(path: Path, hint: str, label: str | None = None, max_bytes: int = MAX_FILE_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """The JSON file at `path`, bounded (size, depth), duplicate keys refused; InputError naming the file."""
    name = label or path.name
    if not path.is_file():
        raise InputError(f"{name}: no such file", hint=hint)
    return parse_json(read_bounded(path, name, hint, max_bytes), name, hint, max_depth)


def read_json_file(path: Path, missing: InputError, fix_hint: str) -> Any:
    """The parsed file; `missing` when it does not exist, an InputError naming the problem otherwise."""
    if not path.is_file():
        raise missing
    return load_json(path, fix_hint)


def parse_yaml(text: str, label: str, hint: str, max_depth: int = MAX_DEPTH) -> Any:
    """`text` as YAML (safe types only), bounded in depth, duplicate keys refused; InputError naming `label`
    (release/core/yamlfile.py: PyYAML loads only where a YAML file is read, not in `relctl bench`)."""
    from release.core.yamlfile import parse_yaml as parse  # noqa: PLC0415 - PyYAML only for YAML files

    return parse(text, label, hint, max_depth)


def load_yaml(path: Path, hint: str, label: str | None = None, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """The YAML file at `path`: UTF-8, bounded, duplicate keys refused; InputError naming the file."""
    name = label or path.name
    if not path.is_file():
        raise InputError(f"{name}: no such file", hint=hint)
    raw = read_bounded(path, name, hint, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})", hint=hint) from exc
    return parse_yaml(text, name, hint)


def expect(data: Any, field: str, kind: type | tuple[type, ...], label: str, hint: str) -> Any:
    """`data[field]` (a dotted path), checked to be of `kind` (bool is never an int here); InputError naming
    `label: field` otherwise."""
    value = data
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            raise InputError(f"{label}: '{field}' is missing", hint=hint)
        value = value[part]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise InputError(f"{label}: '{field}' is {type(value).__name__}, not {names}", hint=hint)
    return value


def load_json_object(path: Path, hint: str, label: str | None = None, missing_ok: bool = False) -> dict[str, Any]:
    """The JSON object in `path` (as `load_json`), or {} for a missing file when `missing_ok`; InputError naming
    the file when its top level is not an object."""
    name = label or f"{path.parent.name}/{path.name}"
    if missing_ok and not path.is_file():
        return {}
    data = load_json(path, hint, name)
    if not isinstance(data, dict):
        raise InputError(f"{name}: the top level is {type(data).__name__}, not an object", hint=hint)
    return data


def optional(data: dict[str, Any], field: str, kind: type | tuple[type, ...], label: str, hint: str) -> Any:
    """`data[field]` checked as `expect` does, or None where it is absent or null."""
    return None if data.get(field) is None else expect(data, field, kind, label, hint)


def read_jsonl(path: Path, hint: str, max_bytes: int = MAX_FILE_BYTES) -> list[tuple[int, Any]]:
    """(line number, value) of each non-blank line of the JSON Lines file `path`: bounded in size, each line as
    `parse_json`, a bad line an InputError naming the file and the line."""
    if not path.is_file():
        raise InputError(f"{path.name}: no such file", hint=hint)
    raw = read_bounded(path, path.name, hint, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path.name}: not UTF-8 text (byte {exc.start})", hint=hint) from exc
    return [(number, parse_json(line, f"{path.name}: line {number}", hint, finite=True))
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
