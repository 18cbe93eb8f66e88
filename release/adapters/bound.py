"""Which base version an adapter package is bound to, read from its signed manifest (never from tags).

The manifest of an adapter package names `kind: adapter` and `base: {model, version, sha256}` (written by the
release, covered by the package's signature): that is the base it was built and validated for. Rollback and
the server that follows the registry refuse a version whose manifest names another base than the one it
would serve on.

a37-serving writes the one binding check every reader uses (release/adapters/trust.py); this is the small
function its callers here use until the two are merged (the lead replaces `base_problem` with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from release.core.errors import InputError
from release.core.package import PackageManifest

ADAPTER_KIND = "adapter"
Fetch = Callable[[str, str | None], tuple[str, PackageManifest]]


def built_for(manifest: dict[str, Any]) -> tuple[str, str, str] | None:
    """(base model, base version, base digest) an adapter package's manifest names; None for a whole model."""
    if manifest.get("kind") != ADAPTER_KIND:
        return None
    base = manifest.get("base")
    if not isinstance(base, dict):
        return ("", "", "")  # an adapter that names no base is bound to none
    return str(base.get("model", "")), str(base.get("version", "")), str(base.get("sha256", ""))


def base_problem(manifest: dict[str, Any], label: str, base_model: str, base_version: str,
                 base_sha256: str | None = None) -> str | None:
    """Why the package `label` (MODEL vN) may not serve on `base_model` v`base_version`; None: it is bound to
    it (its signed manifest names that base version, and that digest when one is given)."""
    bound = built_for(manifest)
    if bound is None:
        return f"{label} is not an adapter (its signed manifest names no kind: adapter)"
    model, version, digest = bound
    if (model, version) != (base_model, base_version) or (base_sha256 and digest != base_sha256):
        return (f"{label} was built for {model or '?'} v{version or '?'} (its signed package says so), not for "
                f"{base_model} v{base_version}")
    return None


def bound_fetch(fetch: Fetch, base_model: str, base_version: str) -> Fetch:
    """`fetch` (model, version -> the version and its verified package) that also refuses a package whose
    signed manifest names another base than `base_model` v`base_version` (exit 2 for a command, HTTP 409 for
    an admin request, `held` for the server that follows the registry)."""

    def checked(model: str, version: str | None) -> tuple[str, PackageManifest]:
        found, package = fetch(model, version)
        problem = base_problem(package.data, f"{model} v{found}", base_model, base_version)
        if problem is not None:
            raise InputError(problem, hint=f"release the adapter onto {base_model} v{base_version}: relctl promote "
                                           f"RUN --onto {base_model}/{base_version}")
        return found, package

    return checked
