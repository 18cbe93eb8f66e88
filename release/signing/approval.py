"""An approval (`relctl approve`): who approved which package, when and why, signed with the release key.

The statement names the package by its manifest and content digests, so it approves those bytes, not a
version number someone could re-point. It is stored on the version (tag `relctl.approval`) with an ECDSA
signature by the release key (tag `relctl.approval_signature`, `<key fingerprint>:<base64 DER>`), which
anyone holding the public key checks with nothing but `cryptography` (`verify_approval`).

Who approves: `RELCTL_USER` when set (CI sets it to the GitHub actor), else git's `user.email` (or
`user.name`) in the project, else the login name (getpass). The source is recorded beside the name.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from release.core.errors import InputError
from release.signing.keys import SigningKey, Trust

USER_ENV = "RELCTL_USER"
REASON_MAX = 1000  # the statement is a registry tag (5000 characters at most)


@dataclass(frozen=True)
class Approver:
    name: str
    source: str  # RELCTL_USER | git config user.email | git config user.name | login


@dataclass(frozen=True)
class Approval:
    model: str
    version: str
    manifest_sha256: str
    content_sha256: str
    approver: str
    approver_source: str
    at: str
    reason: str
    release_run: str | None

    def statement(self) -> str:
        """The exact text that is signed and stored (canonical JSON)."""
        return json.dumps({"_type": "https://relctl.dev/approval/v1", **asdict(self)}, sort_keys=True,
                          separators=(",", ":"))


def approver(project_dir: Path, environ: Mapping[str, str] | None = None) -> Approver:
    env = os.environ if environ is None else environ
    if env.get(USER_ENV, "").strip():
        return Approver(env[USER_ENV].strip(), f"${USER_ENV}")
    for key in ("user.email", "user.name"):
        try:
            found = subprocess.run(["git", "config", "--get", key], cwd=project_dir, capture_output=True,
                                   text=True, timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):  # no git: the login name still says who
            break
        if found:
            return Approver(found, f"git config {key}")
    try:
        return Approver(getpass.getuser(), "login")
    except (KeyError, OSError):
        raise InputError("cannot tell who approves: no $RELCTL_USER, no git user, no login name",
                         hint=f"set {USER_ENV} to your name or email") from None


def new_approval(model: str, version: str, digests: tuple[str, str], release_run: str | None, who: Approver,
                 reason: str) -> Approval:
    """`digests`: the version's (manifest sha256, content sha256), what the approval is for."""
    reason = reason.strip()
    if not reason:
        raise InputError("--reason is empty", hint="say why this version may serve production")
    if len(reason) > REASON_MAX:
        raise InputError(f"--reason is {len(reason)} characters; at most {REASON_MAX}",
                         hint="link to the review instead of pasting it")
    return Approval(model=model, version=version, manifest_sha256=digests[0], content_sha256=digests[1],
                    approver=who.name, approver_source=who.source,
                    at=datetime.now(UTC).isoformat(timespec="seconds"), reason=reason, release_run=release_run)


def sign_approval(statement: str, key: SigningKey) -> str:
    """`<fingerprint>:<base64 DER ECDSA-SHA256>` over the statement's UTF-8 bytes."""
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415 - only when signing
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    private = serialization.load_pem_private_key(key.pem, key.password)
    if not isinstance(private, ec.EllipticCurvePrivateKey):  # keys.signing_key checked it already
        raise InputError(f"signing key {key.label}: not an EC private key", hint="see relctl check")
    signature = private.sign(statement.encode(), ec.ECDSA(hashes.SHA256()))
    return f"{key.fingerprint}:{base64.b64encode(signature).decode()}"


def verify_approval(statement: str, signature: str, trust: Trust) -> str:
    """The trusted key's label that signed `statement`; InputError (exit 2) when it was altered or the
    signer is not trusted."""
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    fingerprint, _, encoded = signature.partition(":")
    key = next((k for k in trust.keys if k.fingerprint == fingerprint), None)
    if key is None:
        raise InputError(f"the approval is signed by key {fingerprint[:16]}, which is not a trusted key",
                         hint=f"trusted: {trust.named()}")
    public = serialization.load_pem_public_key(key.path.read_bytes())
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise InputError(f"trusted key {key.label}: not an EC public key", hint="openssl ec -in key.pem -pubout")
    try:
        public.verify(base64.b64decode(encoded), statement.encode(), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise InputError(f"the approval does not verify with trusted key {key.label} (it was altered)",
                         hint="approve the version again with relctl approve") from None
    return key.label


def parse_statement(statement: str) -> dict[str, Any]:
    """The approval statement a tag holds, through the one bounded loader; anything else is no statement
    (so no approval), never a crash."""
    from release.core.jsonfile import parse_json  # noqa: PLC0415

    try:
        data = parse_json(statement, "approval statement", "approve the version again with relctl approve")
    except InputError:
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class ApprovalStatus:
    """What a version's approval tags amount to. `approved` only for a statement about this version's bytes
    with a valid signature by a trusted key (under `signing: off`: any statement, said to be unsigned)."""

    approved: bool
    text: str                    # "approved by X on T (signed by K)" | "not approved: why" | "unsigned: ..."
    approver: str | None = None
    at: str | None = None
    reason: str | None = None
    signed_by: str | None = None


def approval_status(tags: Mapping[str, str], trust: Trust, model: str, version: str) -> ApprovalStatus:
    """The one reading of a version's approval: verify, rollback, status and the card all ask this."""
    from release.registry import tags as T  # noqa: PLC0415 - the registry's tag names; no MLflow import

    statement = tags.get(T.APPROVAL, "")
    if not statement:
        return ApprovalStatus(False, "not approved")
    data = parse_statement(statement)
    who, at, why = data.get("approver"), data.get("at"), data.get("reason")
    if (data.get("model"), str(data.get("version"))) != (model, version) or (
            data.get("manifest_sha256"), data.get("content_sha256")) != (tags.get(T.MANIFEST_SHA256),
                                                                        tags.get(T.CONTENT_SHA256)):
        return ApprovalStatus(False, "not approved: its approval is for another version or other package bytes")
    signature = tags.get(T.APPROVAL_SIGNATURE, "")
    if trust.off:
        return ApprovalStatus(True, f"approved by {who} on {at} (unsigned: signing is off)", who, at, why)
    if not signature:
        return ApprovalStatus(False, "not approved: its approval carries no signature (approvals are signed by "
                                     "the release key, or they do not count)", who, at, why)
    try:
        signer = verify_approval(statement, signature, trust)
    except InputError as exc:
        return ApprovalStatus(False, f"not approved: {exc.message}", who, at, why)
    return ApprovalStatus(True, f"approved by {who} on {at} (approval signed by {signer})", who, at, why, signer)
