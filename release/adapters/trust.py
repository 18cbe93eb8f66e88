"""Which base an adapter may serve on, decided by its signed package, never by registry tags.

An adapter release writes the base it was built and validated for into the adapter's package manifest
(`base: {model, version, sha256, package_content_sha256}`, release/adapters/release.py), which the release
key signs. Every reader that serves or pins an adapter (`relctl serve --adapters`, the admin switch, the
canary's arms, `relctl render kserve --adapters`, an adapter rollback) verifies the package first
(release/registry/versions.py: manifest digest, signature, the signature vouching for this version), then
asks `check_bound` whether that manifest names the base it is about to serve on. The version's tags
(relctl.base_model, relctl.base_version, relctl.base_sha256) only find candidates fast
(`production_adapters`): anyone with registry write access can change a tag, nobody without the release key
can change a signed manifest.

What may be served by release state is the alias rule of release/registry/states.py (`serving_refusal`):
an adapter's served name follows the production rule, a pinned MODEL:VERSION (a canary's candidate arm)
the candidate rule, so a rejected version is never served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from release.core.errors import InputError
from release.core.package import PackageManifest
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.registry.states import alias_refusal

if TYPE_CHECKING:  # the client loads MLflow: a server states its base without it (release/serving/admin.py)
    from release.registry import Registry

KIND = "adapter"
RELEASE_HINT = "release the adapter onto this base: relctl promote RUN --onto BASE/VERSION (docs/adapters.md)"


@dataclass(frozen=True)
class BaseIdentity:
    """The base a reader is about to serve an adapter on, read from that base's own verified package."""

    model: str
    version: str | None     # None: a package folder, not a registered version (then its content decides)
    base_sha256: str | None  # the base weights it was built from (its manifest's lineage)
    content_sha256: str      # its package content (PackageManifest.content_sha256)

    @classmethod
    def of_package(cls, manifest: PackageManifest, model: str, version: str | None) -> BaseIdentity:
        """From the base's verified package (`manifest.data` is its relctl-package.json)."""
        lineage = manifest.data.get("lineage")
        checkpoint = lineage.get("checkpoint") if isinstance(lineage, dict) else None
        digest = checkpoint.get("base_sha256") if isinstance(checkpoint, dict) else None
        return cls(model, version, digest if isinstance(digest, str) else None, manifest.content_sha256)

    def describe(self) -> str:
        named = f"{self.model} v{self.version}" if self.version else f"{self.model} (a package folder)"
        return f"{named} (base {self.base_sha256 or 'unrecorded'}, package {self.content_sha256[:16]}…)"

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "sha256": self.base_sha256,
                "package_content_sha256": self.content_sha256}

    @classmethod
    def from_dict(cls, data: Any) -> BaseIdentity | None:
        """What a server states about its base (GET /admin/adapters `base`); None when it states nothing."""
        if not isinstance(data, dict) or not isinstance(data.get("model"), str) \
                or not isinstance(data.get("package_content_sha256"), str):
            return None
        version, digest = data.get("version"), data.get("sha256")
        return cls(data["model"], None if version is None else str(version),
                   digest if isinstance(digest, str) else None, data["package_content_sha256"])


@dataclass(frozen=True)
class AdapterBinding:
    """The base an adapter package is bound to by its signed manifest."""

    model: str
    version: str
    base_sha256: str
    content_sha256: str     # "" for a base released before relctl recorded package content digests

    def describe(self) -> str:
        package = f", package {self.content_sha256[:16]}…" if self.content_sha256 else ""
        return f"{self.model} v{self.version} (base {self.base_sha256}{package})"

    def to_dict(self) -> dict[str, str]:
        return {"model": self.model, "version": self.version, "sha256": self.base_sha256,
                "package_content_sha256": self.content_sha256}


def binding_of(manifest: PackageManifest, label: str) -> AdapterBinding:
    """The base `manifest` (an adapter package's, verified by the caller) names; InputError when it is not an
    adapter package or names no base."""
    data = manifest.data
    if data.get("kind") != KIND:
        raise InputError(f"{label} is not an adapter (its package manifest has no kind: {KIND})",
                         hint="serve adapters released with relctl promote RUN --onto BASE@production")
    base = data.get("base")
    fields = [base.get(k) for k in ("model", "version", "sha256", "package_content_sha256")] \
        if isinstance(base, dict) else []
    named = [v for v in fields[:3] if isinstance(v, str) and v]
    if len(named) != 3:
        raise InputError(f"{label}: its package manifest names no base (model, version and sha256 under 'base')",
                         hint="re-release the adapter with this relctl: relctl promote RUN --onto BASE/VERSION")
    content = fields[3]
    return AdapterBinding(named[0], named[1], named[2], content if isinstance(content, str) else "")


def check_bound(manifest: PackageManifest, label: str, base: BaseIdentity) -> AdapterBinding:
    """The one answer to "is this adapter package bound to this base": the base its signed manifest names
    must be `base` (model, version when `base` is a registered version, base-weights digest, and the base
    package's content when the manifest records it; content alone decides for a package folder).
    InputError (exit 2, HTTP 409 on the admin path) naming both sides otherwise; the binding when it is."""
    bound = binding_of(manifest, label)
    differs = [what for what, same in (
        ("model", bound.model == base.model),
        ("version", base.version is None or bound.version == base.version),
        ("base weights", bound.base_sha256 == base.base_sha256),
        ("base package", (not bound.content_sha256 and base.version is not None)
         or bound.content_sha256 == base.content_sha256),
    ) if not same]
    if differs:
        raise InputError(f"{label} is bound by its signed package to {bound.describe()}, not to the base it would "
                         f"serve on, {base.describe()} (they differ in: {', '.join(differs)})", hint=RELEASE_HINT)
    return bound


def tags_disagree(mv: VersionRecord, bound: AdapterBinding) -> str | None:
    """How the version's tags contradict its signed binding (they were changed after release); None: they
    agree. The tags only find adapters: a reader that follows the manifest refuses such a version."""
    said = {T.BASE_MODEL: bound.model, T.BASE_VERSION: bound.version, T.BASE_SHA256: bound.base_sha256}
    wrong = [f"{tag}={mv.tags.get(tag)!r} (signed: {value!r})" for tag, value in said.items()
             if mv.tags.get(tag) != value]
    return "; ".join(wrong) or None


def serving_refusal(registry: Registry, mv: VersionRecord, pinned: bool) -> str | None:
    """Why `mv` may not be served by release state (None: it may): under the adapter's own name as production
    may point at it; pinned as MODEL:VERSION beside it (a canary's candidate arm) as `candidate` may, the
    release still registering it included while the candidate alias names it (its own canary)."""
    from release.registry import CANDIDATE, PRODUCTION  # noqa: PLC0415 - MLflow: only where a registry is read

    version = str(mv.version)
    if not pinned:
        return alias_refusal(PRODUCTION, version, mv.tags, None)
    nominated = registry.aliases(mv.name).get(CANDIDATE) == version
    return alias_refusal(CANDIDATE, version, mv.tags, mv.tags.get(T.RELEASE_RUN) if nominated else None)


def production_adapters(registry: Registry, base_model: str, base_version: str) -> dict[str, VersionRecord]:
    """The production version of every adapter whose tags say it is built for `base_model` v`base_version`:
    candidates found fast (one tag search, then those models' production aliases), each still to be verified
    and checked with `check_bound` before it serves."""
    from release.registry import PRODUCTION  # noqa: PLC0415 - as above

    found: dict[str, VersionRecord] = {}
    built_for = {T.KIND: KIND, T.BASE_MODEL: base_model, T.BASE_VERSION: base_version}
    for name in registry.models_tagged(built_for):
        mv = registry.version_for(name, PRODUCTION)
        if mv is not None and all(mv.tags.get(k) == v for k, v in built_for.items()):
            found[name] = mv
    return found
