"""Sign a released package and verify one, in the OpenSSF model-signing format (PyPI `model-signing`).

The signature (`relctl-package.sig`, a Sigstore bundle holding a DSSE-signed in-toto statement with the
sha256 of every file) sits inside the package folder, beside `relctl-provenance.json` (which run, data,
weights, code and gates produced it), which it covers with every other file, the manifest included.
Anyone can check it without relctl:

    model_signing verify key --signature PKG/relctl-package.sig --public_key release.pub PKG

A package whose files and manifest were rewritten together, with the registry's digests to match, still
fails here: the signature was made with a key the attacker does not hold.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.core.errors import InputError
from release.core.jsonfile import load_json
from release.core.package import MANIFEST, PROVENANCE, SIGNATURE
from release.signing.keys import KEYGEN, TRUSTED_ENV, SigningKey, Trust

PROVENANCE_TYPE = "https://relctl.dev/provenance/v1"
# model-signing raises ValueError(list_of_messages): the text is the list's repr, in which a message holding
# both quote kinds (a digest's bytes may have a `"`) has its single quotes escaped (\'): match either form.
_MISMATCH = re.compile(r"Hash mismatch for \\?'([^'\\]+)\\?'")
_EXTRA = re.compile(r"Extra files found in model '[^']*': ([^,\]\"']+)")
_MISSING = re.compile(r"Missing files in model '[^']*': ([^,\]\"']+)")


@dataclass(frozen=True)
class Verdict:
    """What verification found: `signed_by` (a trusted key's label) or why the package was let through."""

    status: str                     # verified | unsigned | unchecked
    signed_by: str | None = None
    fingerprint: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


def sign_package(root: Path, key: SigningKey, provenance: dict[str, Any]) -> None:
    """Write the provenance, then sign the whole folder (the signature file itself excepted)."""
    from model_signing import hashing, signing  # noqa: PLC0415 - sigstore imports take a second

    (root / PROVENANCE).write_text(json.dumps({"_type": PROVENANCE_TYPE, **provenance}, indent=2, sort_keys=True))
    (root / SIGNATURE).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="relctl-key-") as tmp:
        # model-signing reads the key from a file; a PEM from the environment lives only in this private
        # folder (0700, removed on exit), never in the package, the work folder or a log.
        key_path = Path(tmp) / "key.pem"
        key_path.touch(mode=0o600)
        key_path.write_bytes(key.pem)
        password = key.password.decode() if key.password else None
        # model-signing's Config constructors carry no annotations (the library is typed otherwise).
        config = signing.Config().set_hashing_config(  # type: ignore[no-untyped-call]
            hashing.Config().set_ignored_paths(  # type: ignore[no-untyped-call]
                paths=[SIGNATURE], ignore_git_paths=False))
        config.use_elliptic_key_signer(private_key=key_path, password=password).sign(root, root / SIGNATURE)


def signer_of(root: Path) -> str | None:
    """The fingerprint of the key a package's signature names (model-signing's public key hint)."""
    try:
        bundle = load_json(root / SIGNATURE, "re-sign the package")  # the one bounded loader
        hint = bundle["verificationMaterial"]["publicKey"]["hint"]
    except (OSError, InputError, KeyError, TypeError):
        return None
    return str(hint) if hint else None


def verify_signature(root: Path, trust: Trust, label: str, *, folder: bool = False,
                     warn: Callable[[str], None] | None = None) -> Verdict:
    """Check `root`'s signature against the trusted keys; InputError (exit 2) naming the changed file or the
    untrusted signer. Unsigned: refused for a registered version unless `trust.unsigned` is warn; a package
    folder (`folder`) is served with a warning. With no trusted key configured, nothing is checked."""
    say = warn or (lambda _message: None)
    if trust.off:
        return Verdict("unsigned", note="unsigned: signing is off in release.yaml (signing: off)")
    if not trust.enforced and folder:  # a local folder the user points at: served, saying it was not checked
        say(f"warning: {label}: not verified: this project trusts no release key ({KEYGEN})")
        return Verdict("unchecked", note="no trusted keys configured")
    if not trust.enforced:
        raise InputError(f"{label}: cannot be verified: this project trusts no release key, and only versions signed "
                         "by a trusted key serve or move",
                         hint=f"`{KEYGEN}` makes the project's key pair, or list the release key's public half in "
                              f"signing.trusted_keys or ${TRUSTED_ENV}; `signing: off` in release.yaml turns them off")
    if not (root / SIGNATURE).is_file():
        if folder or trust.unsigned == "warn":
            note = f"{label}: unsigned ({SIGNATURE} missing); served without a signature check"
            say(f"warning: {note}")
            return Verdict("unsigned", note=note)
        raise InputError(f"{label}: unsigned ({SIGNATURE} missing), and only signed versions serve or move",
                         hint="re-promote it with the release key, or sign the versions released before signing "
                              "with `relctl sign MODEL` (docs/signing.md)")
    signer = signer_of(root)
    key = next((k for k in trust.keys if k.fingerprint == signer), None)
    if key is None:
        who = f"key {signer[:16]}" if signer else "an unnamed key"
        raise InputError(f"{label}: signed by {who}, which is not a trusted key",
                         hint=f"trusted: {trust.named()}; add the signer's public key to signing.trusted_keys "
                              "only if it is your release key")
    _verify_with(root, key.path, label, key.label)
    return Verdict("verified", key.label, key.fingerprint, _provenance(root))


def _verify_with(root: Path, public_key: Path, label: str, key_label: str) -> None:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from model_signing import verifying  # noqa: PLC0415

    try:
        verifier = verifying.Config().use_elliptic_key_verifier(  # type: ignore[no-untyped-call]
            public_key=public_key)
        verifier.verify(root, root / SIGNATURE)
    except InvalidSignature:
        raise InputError(f"{label}: {SIGNATURE} does not verify with trusted key {key_label} (the signed statement "
                         "was altered)", hint="restore the package from its release run, or re-promote") from None
    except ValueError as exc:
        raise InputError(f"{label}: {_changed_file(str(exc))} (signature by {key_label})",
                         hint="the package was modified after it was signed; restore it from its release run or "
                              "re-promote") from None


def _changed_file(message: str) -> str:
    """The one line naming what differs: a model file before the manifest rewritten to match it."""
    changed = _MISMATCH.findall(message)
    if changed:
        first = sorted(changed, key=lambda name: name in (MANIFEST, PROVENANCE))[0]
        return f"{first} differs from the signed package"
    for pattern, what in ((_EXTRA, "is not in the signed package"), (_MISSING, "is missing from the package")):
        found = pattern.search(message)
        if found:
            return f"{found.group(1).strip()} {what}"
    return f"the package does not match its signature ({message[:200]})"


def _provenance(root: Path) -> dict[str, Any]:
    try:
        data = load_json(root / PROVENANCE, "re-sign the package")  # the one bounded loader
    except (OSError, InputError):
        return {}
    return data if isinstance(data, dict) else {}


def check_binding(verdict: Verdict, model: str, version: str, release_run: str | None, label: str,
                  describe_run: Callable[[str], str | None] | None = None) -> None:
    """A verified package must vouch for the version being verified: its signed provenance names the registered
    model and the release run that created this version. Another version's (or another model's) signed package
    copied into this version's place verifies as a signature, and is refused here naming both.
    `describe_run`: how to name the version another release run registered (the registry knows)."""
    if verdict.status != "verified":
        return
    signed_model = verdict.provenance.get("model")
    signed_run = verdict.provenance.get("release_run")
    signed_version = verdict.provenance.get("version")
    wanted = f"{model} v{version}" + (f" (release run {release_run})" if release_run else "")
    if signed_model != model:
        raise InputError(f"{label}: the package is signed for model {signed_model or 'unnamed'} (release run "
                         f"{signed_run or 'unnamed'}), not for {wanted}",
                         hint="another model's package was put in this version's place; restore the version's own "
                              "package from its release run")
    if (release_run is not None and signed_run != release_run) or (
            signed_version is not None and str(signed_version) != str(version)):
        other = describe_run(str(signed_run)) if describe_run and signed_run else None
        named = other or (f"{model} v{signed_version}" if signed_version is not None else f"release run {signed_run}")
        raise InputError(f"{label}: the package is signed for {named} (release run {signed_run}), not for {wanted}",
                         hint="another version's package was put in this version's place (a replay of old bytes); "
                              "restore the version's own package from its release run")
