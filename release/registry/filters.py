"""MLflow filter strings (search_runs, search_model_versions): every value and key quoted here, never pasted.

MLflow's parser strips a literal's outer quotes and unescapes nothing, so `name = '{name}'` breaks (or
matches something else) on a value holding a quote. Every filter relctl builds goes through `literal`
and `identifier`.
"""

from __future__ import annotations

from release.core.errors import InputError


def literal(value: str) -> str:
    """`value` as a string literal, quoted with whichever quote it does not contain.

    One holding both quote kinds (or a backslash, which the tokenizer reads as an escape) cannot be
    searched for exactly, and is refused rather than searched for wrongly.
    """
    if "\\" not in value:
        if "'" not in value:
            return f"'{value}'"
        if '"' not in value:
            return f'"{value}"'
    raise InputError(f"{value!r} cannot be written as an MLflow search value (it holds both quote kinds or a "
                     "backslash)", hint="use names and tag values without quotes or backslashes")


def identifier(key: str) -> str:
    """A tag or param key as a backquoted identifier."""
    if "`" in key or "\\" in key:
        raise InputError(f"{key!r} cannot be written as an MLflow search key", hint="use keys without backquotes")
    return f"`{key}`"
