"""`relctl sign MODEL`: move a project whose versions were released unsigned (before signing, or under
`signing: off`) to signing, in one command.

Each unsigned version's package is downloaded and checked against the manifest digest the registry recorded
when it was released (the same check serve made before signing), then signed with the release key, its
provenance naming the model, the version, its release run (MLflow's version source run) and `builder:
relctl sign` — the signature says "these bytes were what the registry vouched for when they were signed",
not "these bytes passed the gates": check `relctl history` first if the store may have been tampered with.
The signature and provenance are added beside the package in its release run; the version is then verified
like any other (signature, binding). Versions signed already are verified and left alone.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from release.core.errors import InputError
from release.core.package import PROVENANCE, SIGNATURE, verify_package
from release.registry import Registry
from release.registry import tags as T
from release.registry.states import APPROVED, AWAITING_APPROVAL
from release.registry.versions import fetch_verified, package_uri
from release.signing.approval import sign_approval
from release.signing.keys import SigningKey, Trust
from release.signing.package import sign_package


@dataclass(frozen=True)
class Signed:
    version: str
    outcome: str      # signed | already signed


def sign_existing(registry: Registry, model: str, key: SigningKey, trust: Trust,
                  only: str | None = None) -> list[Signed]:
    """Sign every unsigned version of `model` (or version `only`); InputError before anything is written when
    signing is off or the key is not trusted (release_key checked it), or a package differs from its digest."""
    if trust.off:
        raise InputError("release.yaml says `signing: off`", hint="remove `signing: off` first, then relctl sign")
    registry.require_model(model)
    versions = [registry.get_version(model, only)] if only else registry.versions(model)
    done = []
    for mv in versions:
        version = str(mv.version)
        uri = package_uri(dict(mv.tags)) or ""
        run_id, _, path = uri.removeprefix("runs:/").partition("/")
        anchor = mv.tags.get(T.MANIFEST_SHA256)
        if not uri.startswith("runs:/") or not anchor:
            raise InputError(f"{model} v{version}: no package in a release run or no manifest digest recorded",
                             hint="re-register it with relctl register (which signs it)")
        with tempfile.TemporaryDirectory(prefix="relctl-sign-") as tmp:
            local = registry.download_uri(uri, Path(tmp))
            if (local / SIGNATURE).is_file():
                fetch_verified(registry, model, version, Path(tmp) / "check", mv, trust=trust)
                done.append(Signed(version, "already signed"))
                continue
            try:
                package = verify_package(local, manifest_sha256=anchor)
            except InputError as exc:
                raise InputError(f"{model} v{version}: {exc.message}; not signed",
                                 hint="it differs from what was released: restore it or leave it unsigned") from exc
            state = mv.tags.get(T.RELEASE_STATE)
            sign_package(package.root, key, {
                "model": model, "version": version, "release_run": mv.run_id or mv.tags.get(T.RELEASE_RUN),
                "builder": "relctl sign", "manifest_sha256": anchor,
                "content_sha256": mv.tags.get(T.CONTENT_SHA256),
                "require_approval": state in (AWAITING_APPROVAL, APPROVED) or T.GATED_AGAINST in mv.tags})
            registry.add_run_files(run_id, [local / SIGNATURE, local / PROVENANCE], path)
        signed_tags = {T.SIGNED_BY: key.fingerprint}
        if mv.tags.get(T.APPROVAL) and not mv.tags.get(T.APPROVAL_SIGNATURE):
            # An approval recorded unsigned (signing was off) would no longer count: it is vouched for now.
            signed_tags[T.APPROVAL_SIGNATURE] = sign_approval(mv.tags[T.APPROVAL], key)
        registry.set_version_tags(model, version, signed_tags)
        with tempfile.TemporaryDirectory(prefix="relctl-sign-") as tmp:
            fetch_verified(registry, model, version, Path(tmp), trust=trust)  # as serve will see it
        done.append(Signed(version, "signed"))
    return done
