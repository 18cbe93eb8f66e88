"""Which key signs a release and which public keys are trusted, from release.yaml's `signing:` block and env.

Signing is on unless release.yaml says `signing: off` (the whole block): every release is signed and every
registered version verified; a project without a key is refused before any slow stage with the one command
that makes one (`relctl keygen`).

- The signing key: `RELCTL_SIGNING_KEY` (as CI secrets come: the PEM, quoted or `\\n`-escaped or after a
  comment line, base64 of the PEM or DER, or a path to a key file) or `signing.key` (default
  `.relctl/keys/release.pem`, relative to release.yaml's folder); `RELCTL_SIGNING_KEY_PASSWORD` for an
  encrypted key. It is a secret: messages name its path or the variable, never its content; a key file
  readable by group or others is refused with the chmod that fixes it; it is loaded (and checked to be an
  EC private key whose public half the project trusts) before any slow stage.
- The trusted keys: `signing.trusted_keys` (default `keys/release.pub`, committed) plus `RELCTL_TRUSTED_KEYS`
  (PEM public key paths separated by os.pathsep). With none, a registered version cannot be verified and is
  refused (under `signing: off` nothing is verified, and readers say "unsigned").
- `signing.unsigned` (or `RELCTL_UNSIGNED`): what a registered version with no signature gets (one
  released before signing was set up): `refuse` (default) or `warn`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from release.config import CONFIG_FILE, SigningConfig, load_config
from release.core.errors import InputError

KEY_ENV = "RELCTL_SIGNING_KEY"
PASSWORD_ENV = "RELCTL_SIGNING_KEY_PASSWORD"
TRUSTED_ENV = "RELCTL_TRUSTED_KEYS"
UNSIGNED_ENV = "RELCTL_UNSIGNED"
_PEM = "-----BEGIN"
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")
Unsigned = Literal["refuse", "warn"]


def fingerprint(public_pem: bytes) -> str:
    """How model-signing names a key in a signature (its bundle's public key hint): sha256 of the
    SubjectPublicKeyInfo PEM, hex."""
    return hashlib.sha256(public_pem).hexdigest()


@dataclass(frozen=True)
class SigningKey:
    """A loaded private key. `label` (a path or the variable's name) is what any message may show."""

    label: str
    pem: bytes = field(repr=False)
    password: bytes | None = field(default=None, repr=False)
    fingerprint: str = ""


@dataclass(frozen=True)
class TrustedKey:
    label: str
    path: Path
    fingerprint: str


@dataclass(frozen=True)
class Trust:
    """The keys a version's signature must come from. `off`: release.yaml says `signing: off`, so nothing is
    verified and every reader says "unsigned"; otherwise a verification with no trusted key refuses."""

    keys: tuple[TrustedKey, ...] = ()
    unsigned: Unsigned = "refuse"
    off: bool = False

    @property
    def enforced(self) -> bool:
        return bool(self.keys)

    def trusts(self, fingerprint_: str) -> bool:
        return any(k.fingerprint == fingerprint_ for k in self.keys)

    def named(self) -> str:
        return ", ".join(f"{k.label} ({k.fingerprint[:16]})" for k in self.keys) or "none"


DEFAULT_KEY = ".relctl/keys/release.pem"      # git-ignored with the rest of .relctl/ (relctl init, keygen)
DEFAULT_PUBLIC = "keys/release.pub"          # committed: the project's trusted key
KEYGEN = "relctl keygen"                     # the one command that gives a project its key pair


def signing_key(cfg: SigningConfig, base: Path, environ: Mapping[str, str] | None = None
                ) -> SigningKey | None:
    """The release's signing key, loaded and checked; None when none is configured. InputError (exit 2),
    naming the path or the variable only, when it is missing, unreadable, readable by others or not an EC
    private key. `base`: release.yaml's folder, which signing.key is relative to."""
    env = os.environ if environ is None else environ
    value = env.get(KEY_ENV, "")
    if value.strip():
        label, pem = f"${KEY_ENV}", _env_key(value, base)
    else:
        where = cfg.key or DEFAULT_KEY
        path = Path(where).expanduser() if Path(where).expanduser().is_absolute() else base / where
        if cfg.key is None and not path.exists():
            return None
        label = f"{path} (signing.key)" if cfg.key else str(path)
        pem = _read_private(path, label)
    password = env.get(PASSWORD_ENV)
    public = _private_key_public_pem(pem, password.encode() if password else None, label)
    return SigningKey(label, pem, password.encode() if password else None, fingerprint(public))


def _env_key(value: str, base: Path) -> bytes:
    """RELCTL_SIGNING_KEY as CI secrets come: the PEM (quoted, with `\\n` escapes, after a comment line),
    base64 of the PEM or of DER, or a path to a key file. Never echoed: a message names the variable only."""
    text = value.strip().strip("'\"").strip()
    if "\\n" in text and "\n" not in text:
        text = text.replace("\\n", "\n")
    begin = text.find(_PEM)
    if begin >= 0:
        return text[begin:].strip().encode() + b"\n"
    if "\n" not in text and len(text) < 1024:
        for path in (Path(text).expanduser(), base / text):  # as given (the caller's folder), then the project's
            try:
                found = path.is_file()
            except OSError:  # a name too long for the file system: not a path
                found = False
            if found:
                return _read_private(path, f"{path} (from ${KEY_ENV})")
    compact = "".join(text.split())
    if compact and _BASE64.fullmatch(compact):
        try:
            decoded = base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
        except (ValueError, binascii.Error):
            decoded = b""
        if _PEM.encode() in decoded:
            return decoded[decoded.index(_PEM.encode()):]
        if decoded.startswith(b"\x30"):  # DER: an ASN.1 SEQUENCE; made PEM so one loader reads both
            return _der_to_pem(decoded)
    raise InputError(f"${KEY_ENV} is set but holds no key: not a PEM key, base64 of one, or the path of a key file",
                     hint=f"store the PEM file's whole text (or `base64 -w0 release.pem`) in the secret; {KEYGEN} "
                          "makes a key pair")


def _der_to_pem(der: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - only for a DER secret

    try:
        key = serialization.load_der_private_key(der, None)
    except (ValueError, TypeError):
        raise InputError(f"${KEY_ENV} is set but holds no key: base64 that is neither a PEM nor a DER private key",
                         hint="store the PEM file's whole text (or `base64 -w0 release.pem`) in the secret") from None
    pem: bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())
    return pem


def _read_private(path: Path, label: str) -> bytes:
    """A private key file, refused when group or others may read it (it is a secret like an SSH key)."""
    data = _read(path, label, "signing key")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise InputError(f"signing key {label} is readable by group or others (mode {mode:04o})",
                         hint=f"chmod 600 {shlex.quote(str(path))}")
    return data


def _read(path: Path, label: str, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} {label}: no such file",
                         hint=f"{KEYGEN} makes the project's key pair; or set signing.key in release.yaml or "
                              f"{KEY_ENV}") from None
    except OSError as exc:
        raise InputError(f"{what} {label}: cannot be read: {exc.strerror}",
                         hint="check the file's permissions (the user running relctl must read it)") from None


def _private_key_public_pem(pem: bytes, password: bytes | None, label: str) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - only when signing
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    try:
        key = serialization.load_pem_private_key(pem, password)
    except (ValueError, TypeError) as exc:
        # The library's message never holds the key, but say only what is safe and useful.
        why = "wrong or missing password" if "password" in str(exc).lower() else "not a PEM private key"
        raise InputError(f"signing key {label}: {why}",
                         hint=f"a PEM EC key (openssl ecparam -name prime256v1 -genkey -noout); {PASSWORD_ENV} "
                              "for an encrypted one") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in (
            "secp256r1", "secp384r1", "secp521r1"):
        raise InputError(f"signing key {label}: not an EC P-256/P-384/P-521 private key (model-signing signs "
                         "with those only)", hint="openssl ecparam -name prime256v1 -genkey -noout -out key.pem")
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)


def trusted_keys(cfg: SigningConfig, base: Path, environ: Mapping[str, str] | None = None) -> Trust:
    """The public keys whose signatures are trusted, each loaded and checked; InputError naming a bad one."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    env = os.environ if environ is None else environ
    configured = cfg.trusted_keys or ([DEFAULT_PUBLIC] if (base / DEFAULT_PUBLIC).is_file() else [])
    paths = [base / p if not Path(p).is_absolute() else Path(p) for p in configured]
    paths += [Path(p) for p in env.get(TRUSTED_ENV, "").split(os.pathsep) if p.strip()]
    keys = []
    for path in paths:
        data = _read(path, str(path), "trusted key")
        try:
            public = serialization.load_pem_public_key(data)
        except ValueError:
            raise InputError(f"trusted key {path}: not a PEM public key",
                             hint="openssl ec -in key.pem -pubout -out key.pub") from None
        spki = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        keys.append(TrustedKey(path.name, path, fingerprint(spki)))
    unsigned = env.get(UNSIGNED_ENV) or cfg.unsigned
    if unsigned not in ("refuse", "warn"):
        raise InputError(f"{UNSIGNED_ENV}={unsigned}: expected refuse or warn", hint="unset it or choose one")
    return Trust(tuple(keys), "warn" if unsigned == "warn" else "refuse", off=not cfg.enabled)


def release_key(cfg: SigningConfig, base: Path, environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The key that signs a release (promote, register, approve, publish): None only under `signing: off`.
    InputError (exit 2), before anything is written, when there is none, or when the project does not trust
    its public half (every release it signed would then be refused by serve, rollback and verify)."""
    if not cfg.enabled:
        return None
    key = signing_key(cfg, base, environ)
    if key is None:
        raise InputError(f"no release signing key: {base / (cfg.key or DEFAULT_KEY)} does not exist and "
                         f"${KEY_ENV} is not set, and every release is signed",
                         hint=f"run `{KEYGEN}` in the project (or `signing: off` in release.yaml to release unsigned)")
    trust = trusted_keys(cfg, base, environ)
    if not trust.trusts(key.fingerprint):
        raise InputError(f"signing key {key.label} (fingerprint {key.fingerprint[:16]}) is not a trusted key of this "
                         "project: every version it signed would be refused",
                         hint=f"commit its public half as {DEFAULT_PUBLIC} (signing.trusted_keys); trusted now: "
                              f"{trust.named()}")
    return key


def signing_problem(cfg: SigningConfig, base: Path, environ: Mapping[str, str] | None = None
                    ) -> tuple[str, str] | None:
    """(message, hint) when the release key or a trusted key cannot be used: `relctl check` and promote's
    first step report it before any slow stage."""
    try:
        release_key(cfg, base, environ)
        trusted_keys(cfg, base, environ)
    except InputError as exc:
        return exc.message, exc.hint or ""
    return None


def project_config(project_dir: Path) -> Path | None:
    path = project_dir / CONFIG_FILE
    return path if path.is_file() else None


def project_trust(project_dir: Path, environ: Mapping[str, str] | None = None) -> Trust:
    """The trust of the project at `project_dir` (its release.yaml, if any, and the environment): what serve,
    rollback, canary and trace verify registered versions against."""
    return trusted_keys(load_config(project_config(project_dir)).signing, project_dir, environ)


def project_signing_key(project_dir: Path, environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The project's release key, checked as release_key does (None only under `signing: off`)."""
    return release_key(load_config(project_config(project_dir)).signing, project_dir, environ)
