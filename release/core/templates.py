"""The template files shipped with relctl (package data `release/templates`; in a checkout, a link to
templates/): read by `relctl init` and `relctl render kserve`."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from release.core.errors import InputError


def templates_dir() -> Path:
    """relctl's templates folder: package data `release/templates` (in a checkout, a link to templates/)."""
    return Path(str(files("release").joinpath("templates")))


def template_text(name: str) -> str:
    """The text of one template file shipped with relctl, or of a backend plug-in's own template, which it
    names by absolute path (package data of its own package: `Deploy.kserve_template`, `Deployment.template`)."""
    path = templates_dir() / name
    if not path.is_file():
        raise InputError(f"template '{name}' is missing from this relctl installation",
                         hint="reinstall relctl; its wheel ships templates/ as package data")
    return path.read_text()
