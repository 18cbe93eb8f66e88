"""Serving-engine backends, found through the `relctl.backends` entry-point group (built-ins too):

    [project.entry-points."relctl.backends"]
    my-engine = "mypkg.backend:MyEngineBackend"

A new engine is one package with a `release.backends.base.Backend` subclass whose `id` is the entry-point
name, plus that entry point. `choose_backend` picks the backend for a checkpoint from its config.json
alone, so an unsupported family is refused in seconds, naming what each installed backend takes.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

from release.backends.base import Backend, Support, architecture, precision_choices
from release.core.errors import InputError
from release.core.package import MANIFEST, PackageManifest, read_manifest
from release.core.plugins import PluginBroken, group_entry_points, load_plugin

ENTRY_POINT_GROUP = "relctl.backends"
AUTO = "auto"

__all__ = ["AUTO", "Backend", "Support", "available_backends", "backend_for_folder", "backend_of", "choose_backend",
           "get_backend", "installed_precisions"]


@functools.cache
def _discovered() -> tuple[dict[str, Backend], dict[str, str]]:
    """(backends by id, in declared preference order (`Backend.preference`, then id); why each broken plug-in
    failed to load). Cached: entry points do
    not change in a process. A plug-in that fails to import does not take the working ones down with it:
    serving an onnxruntime-genai package must not depend on a third-party engine package importing."""
    found: dict[str, Backend] = {}
    broken: dict[str, str] = {}
    for name, ep in group_entry_points(ENTRY_POINT_GROUP).items():
        try:
            found[name] = _load(ep)
        except PluginBroken as exc:   # raised, exited or printed at import, or not a Backend of its own id
            broken[name] = exc.reason
        except Exception as exc:  # its constructor failed: the plug-in's bug, not relctl's
            broken[name] = f"backend plug-in '{ep.value}' failed to load: {type(exc).__name__}: {exc}"
    ordered = dict(sorted(found.items(), key=lambda item: (item[1].preference, item[0])))
    return ordered, broken


def available_backends() -> dict[str, Backend]:
    """Every installed backend that loads, by id, in preference order (what `auto` tries first)."""
    return _discovered()[0]


def broken_backends() -> dict[str, str]:
    """Installed backend plug-ins that failed to load, by id, with the reason."""
    return _discovered()[1]


def _load(ep: EntryPoint) -> Backend:
    # The one plug-in loader (release/core/plugins.py): isolated import, a Backend subclass whose id is the name
    # manifests record and release.yaml gives.
    cls: type[Backend] = load_plugin(ep, "backend", base=Backend)
    return cls()


def get_backend(backend_id: str) -> Backend:
    """The installed backend `backend_id`; InputError naming the installed ones otherwise."""
    found = available_backends()
    if backend_id in broken_backends():
        raise InputError(broken_backends()[backend_id],
                         hint=f"fix or reinstall the package that provides backend '{backend_id}'")
    if backend_id not in found:
        raise InputError(f"backend '{backend_id}' is not installed",
                         hint=f"installed backends: {', '.join(found) or 'none'}; install the package that "
                              "provides it (relctl.backends entry point)")
    return found[backend_id]


def backend_of(package: PackageManifest) -> Backend:
    """The installed backend that built `package` (InputError naming it when it is not installed here)."""
    return get_backend(package.backend_id)


def backend_for_folder(model_dir: Path, requested: str = AUTO) -> Backend:
    """The backend of an already-built folder: `requested`; the one its package's manifest names when the
    folder is a package's model/; else the first installed backend that recognizes the folder's files."""
    if requested != AUTO:
        return get_backend(requested)
    if (model_dir.parent / MANIFEST).is_file():
        return backend_of(read_manifest(model_dir.parent))
    for backend in available_backends().values():
        if backend.recognizes(model_dir):
            return backend
    wanted = "; ".join(f"{b.id}: {', '.join(b.runtime_files)}" for b in available_backends().values())
    raise InputError(f"{model_dir}: not a model folder any installed backend serves",
                     hint=f"pass a folder relctl convert built (files each backend needs: {wanted})")


def installed_precisions() -> list[str]:
    """The precisions any installed backend builds: the one source for every precision choice."""
    return precision_choices(list(available_backends().values()))


def family_of(config: dict[str, Any]) -> str:
    if architecture(config):
        return architecture(config)
    model_type = config.get("model_type")
    return model_type if isinstance(model_type, str) and model_type else "unknown (no architectures/model_type)"


def choose_backend(config: dict[str, Any], requested: str, precision: str, execution_provider: str) -> Backend:
    """The backend that will build and serve this checkpoint at `precision` on `execution_provider`.

    `requested` is a backend id or "auto" (the most preferred installed backend, `Backend.preference`, that
    supports the family and the target). Refusals are InputErrors naming the family and what each installed
    backend supports.
    """
    candidates = list(available_backends().values()) if requested == AUTO else [get_backend(requested)]
    reasons: list[str] = []
    for backend in candidates:
        support = backend.supports(config)
        if not support.supported:
            reasons.append(f"{backend.id}: {support.reason}")
            continue
        problem = backend.target_problem(precision, execution_provider) or \
            backend.device_problem(config, precision, execution_provider)
        if problem is not None:
            reasons.append(f"{backend.id}: {problem}")
            continue
        return backend
    family = family_of(config)
    reasons += [f"{name}: not loaded ({why})" for name, why in broken_backends().items() if requested == AUTO]
    offered = "; ".join(b.describe() for b in available_backends().values())
    raise InputError(f"config.json: {family} at {precision} on {execution_provider} is not supported by "
                     f"{'any installed backend' if requested == AUTO else requested} ({' | '.join(reasons)})",
                     hint=f"installed backends: {offered}")
