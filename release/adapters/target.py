"""`--onto MODEL@ALIAS` or `MODEL/VERSION`: the base version an adapter is released onto."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from release.core.errors import InputError
from release.core.model_name import check_model_name, check_version_number

HINT = "name the serving base as MODEL@production (an alias) or MODEL/3 (a version)"


@dataclass(frozen=True)
class BaseTarget:
    model: str
    alias: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.model}@{self.alias}" if self.alias else f"{self.model}/{self.version}"


def parse_target(spec: str) -> BaseTarget:
    """The base named by `spec`, or InputError (exit 2) before any registry call."""
    if "@" in spec:
        model, alias = spec.split("@", 1)
        if not alias or not alias.replace("-", "").replace("_", "").isalnum():
            raise InputError(f"--onto {spec!r}: '{alias}' is not an alias name", hint=HINT)
        return BaseTarget(check_model_name(model, "--onto"), alias=alias)
    if "/" in spec:
        model, version = spec.rsplit("/", 1)
        return BaseTarget(check_model_name(model, "--onto"), version=check_version_number(version, "--onto"))
    raise InputError(f"--onto {spec!r} names no base version", hint=HINT)


def adapter_onto(onto: str | None, project_dir: Path, config_path: Path | None) -> str | None:
    """The base `relctl promote` releases an adapter onto: `--onto`, else release.yaml's `release.onto` when
    its `release.mode` is adapter; None for a merged release. Bad input is exit 2 before any registry call:
    a malformed target, mode adapter without onto, --onto disagreeing with release.yaml."""
    from release.config import CONFIG_FILE, load_config  # noqa: PLC0415 - pydantic: not at import time

    if onto is not None:
        parse_target(onto)
    if config_path is None and (project_dir / CONFIG_FILE).is_file():
        config_path = project_dir / CONFIG_FILE
    return load_config(config_path).adapter_onto(onto)
