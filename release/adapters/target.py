"""`--onto MODEL@ALIAS` or `MODEL/VERSION`: the base version an adapter is released onto."""

from __future__ import annotations

from pathlib import Path

from release.registry.refs import ONTO, ModelRef, parse_ref

BaseTarget = ModelRef  # the base an adapter goes onto: a registered version by alias or number


def parse_target(spec: str) -> BaseTarget:
    """The base named by `spec`, or InputError (exit 2) before any registry call (release/registry/refs.py:
    the one parser of MODEL@ALIAS and MODEL/VERSION)."""
    return parse_ref(spec, ONTO)


def adapter_onto(onto: str | None, project_dir: Path, config_path: Path | None) -> str | None:
    """The base `relctl promote` releases an adapter onto: `--onto`, else release.yaml's `release.onto` when
    its `release.mode` is adapter; None for a merged release. Bad input is exit 2 before any registry call:
    a malformed target, mode adapter without onto, --onto disagreeing with release.yaml."""
    from release.config import config_path as resolve_config  # noqa: PLC0415 - pydantic: not at import time
    from release.config import load_config  # noqa: PLC0415 - as above

    if onto is not None:
        parse_target(onto)
    return load_config(resolve_config(project_dir, config_path)).adapter_onto(onto)
