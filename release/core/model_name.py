"""The one rule for registered model names relctl manages, checked where a name is decided.

A model name travels into MLflow filter strings, `models:/NAME/V` URIs, UI links, log file names and
command lines. MLflow itself refuses only '/' and ':', and only when the model is created (after every
slow stage). relctl takes one strict alphabet instead, checked where a name is decided (release.yaml
`model:`, a command-line argument, the training run's experiment name) before anything runs.
No imports beyond the errors: release.config uses it, and must stay light to import.
"""

from __future__ import annotations

import re

from release.core.errors import InputError

MAX_NAME = 128
MODEL_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME - 1}}}")
NAME_RULE = f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {MAX_NAME} characters"
NAME_HINT = "choose a name like 'tiny-llm' or 'support_bot.v2'"
# relctl's alias leases are registered models in this namespace (release/registry/lock.py): never a user's.
LOCK_PREFIX = "relctl.lock."


def is_reserved_name(name: str) -> bool:
    """A name in the lease namespace (compared case-insensitively: some backends compare names so)."""
    return name.casefold().startswith(LOCK_PREFIX)


def bad_model_name(name: object) -> str | None:
    """Why `name` cannot be a registered model name relctl manages, or None when it can."""
    if not isinstance(name, str) or not name:
        return "a model name must be a non-empty string"
    if not MODEL_NAME.fullmatch(name):
        return f"model name {name!r} is not valid: use {NAME_RULE}"
    if is_reserved_name(name):
        return f"model name '{name}' is reserved: names starting with '{LOCK_PREFIX}' are relctl's alias leases"
    return None


def check_model_name(name: str, where: str, hint: str = NAME_HINT) -> str:
    """`name`, or InputError (exit 2) saying where the bad name came from."""
    why = bad_model_name(name)
    if why is not None:
        raise InputError(f"{where}: {why}", hint=hint)
    return name


# MLflow takes a version as int(text) and stores it in a 64-bit signed integer column: anything past that
# reaches the store as an overflow (an infrastructure-looking failure), so it is refused first.
MAX_VERSION = 2**63 - 1


def bad_version_number(version: object) -> str | None:
    """Why `version` cannot be an MLflow model version number, or None when it can."""
    text = str(version)
    if not text.isascii() or not text.isdigit():
        return f"version {text!r} is not a decimal version number"
    if len(text.lstrip("0")) > 19 or not 1 <= int(text) <= MAX_VERSION:
        return f"version {text} is out of range: MLflow's versions run from 1 to {MAX_VERSION}"
    return None


def check_version_number(version: str, where: str) -> str:
    """`version`, or InputError (exit 2) naming where it came from; checked before any registry call."""
    why = bad_version_number(version)
    if why is not None:
        raise InputError(f"{where}: {why}", hint="pass a version number `relctl history MODEL` lists")
    return version
