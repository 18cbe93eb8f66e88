"""Bounded JSON decoding of request bodies, before any schema sees them.

`json.loads` alone is not safe on hostile input: nesting recurses in C until RecursionError, "NaN" and
"Infinity" are accepted, a 5,000-digit integer raises ValueError, and "\\ud800" decodes to a lone
surrogate that later breaks the tokenizer. Each of these is a 400 here, naming the field where there is one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from release.core.jsonfile import nesting_depth
from release.serving.protocol import RequestProblem, SamplingFields

MAX_DEPTH = 16
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|(list|dict|tuple|function-\w+)\[.*\]|[A-Z]\w*)$")

# Fields of OpenAI's completions and chat APIs that this server does not implement, with the values that
# mean "not used" (sent by many clients as defaults): anything else is refused, never silently ignored.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "n": (None, 1),
}


def parse_body(raw: bytes, schema: type[SamplingFields]) -> SamplingFields:
    """Decode JSON (bounded), refuse unsupported OpenAI fields, validate against `schema`; any problem is a
    RequestProblem naming the first bad field."""
    data = decode_json(raw)
    # `n` is declared only to pin it to 1: the table below says so in words.
    refuse_unsupported(data, implemented=frozenset(schema.model_fields) - {"n"})
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise RequestProblem(_field_path(err["loc"]) or "body", err["msg"]) from exc


def _field_path(loc: tuple[int | str, ...]) -> str:
    """`messages.0.content` from pydantic's location, without its union-member tags ('str', 'list[str]')."""
    return ".".join(str(p) for p in loc if not _UNION_TAG.match(str(p)))


def decode_json(raw: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The request object, or RequestProblem("body", ...) for anything but a bounded, valid JSON object."""
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise RequestProblem("body", f"JSON nested {depth} levels deep; this server accepts at most {max_depth}")
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except RequestProblem:
        raise
    except UnicodeDecodeError as exc:
        raise RequestProblem("body", "not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise RequestProblem("body", f"invalid JSON: {exc.msg} at position {exc.pos}") from exc
    except (ValueError, RecursionError) as exc:  # e.g. an integer beyond Python's 4,300-digit limit
        raise RequestProblem("body", f"invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RequestProblem("body", "must be a JSON object")
    bad = first_unencodable(data)
    if bad is not None:
        path, why = bad
        raise RequestProblem(path or "body", why)
    return data


def _refuse_constant(name: str) -> Any:
    raise RequestProblem("body", f"invalid JSON: {name} is not a JSON number")


def first_unencodable(value: Any, path: str = "") -> tuple[str, str] | None:
    """(field path, reason) of the first string (key or value) the tokenizer cannot take, else None.

    A lone surrogate is not Unicode text (not encodable as UTF-8); a NUL ends the C string the tokenizer
    receives, so the rest of the prompt would silently vanish.
    """
    if isinstance(value, str):
        return _string_problem(value, path)
    if isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            problem = _string_problem(key, sub) or first_unencodable(item, sub)
            if problem:
                return problem
    elif isinstance(value, list):
        for i, item in enumerate(value):
            problem = first_unencodable(item, f"{path}.{i}" if path else str(i))
            if problem:
                return problem
    return None


def _string_problem(text: str, path: str) -> tuple[str, str] | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return path, "contains a lone UTF-16 surrogate (not valid Unicode text)"
    if "\x00" in text:
        return path, "contains a NUL character (U+0000)"
    return None


def refuse_unsupported(data: dict[str, Any], implemented: frozenset[str] = frozenset()) -> None:
    """400 naming the first field OpenAI accepts but this server does not implement (set to a real value);
    `implemented`: the fields the endpoint's schema takes (completions' `logprobs` and `echo`, not chat's)."""
    for name, neutral in UNSUPPORTED.items():
        if name not in implemented and name in data and not any(_same(data[name], n) for n in neutral):
            if name in ("n", "best_of"):
                raise RequestProblem(name, "only 1 is supported (one completion per request)")
            raise RequestProblem(name, "not supported by this server (text generation only); "
                                       "leave it out")


def _same(value: Any, neutral: Any) -> bool:
    # True == 1 and False == 0 in Python; "logprobs": true must not pass as the neutral 1 of "n".
    return (type(value) is type(neutral) and value == neutral) or (
        isinstance(value, float) and type(neutral) is int and value == neutral)
