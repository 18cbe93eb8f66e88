"""Which key signs a release and which public keys are trusted, from release.yaml's `signing:` block and env.

- The signing key: `RELCTL_SIGNING_KEY` (a path to a PEM file, or the PEM text itself, as CI secrets come)
  or `signing.key` (a path relative to release.yaml's folder); `RELCTL_SIGNING_KEY_PASSWORD` for an
  encrypted key. It is a secret: messages name its path or the variable, never its content, and it is
  loaded (and checked to be an EC private key) before any slow stage, so a bad key fails in seconds.
- The trusted keys: `signing.trusted_keys` plus `RELCTL_TRUSTED_KEYS` (PEM public key paths separated by
  os.pathsep). With none configured nothing is verified (a project that never set up signing keeps
  working); with any, every registered version must carry a signature by one of them.
- `signing.unsigned` (or `RELCTL_UNSIGNED`): what a registered version with no signature gets (one
  released before signing was set up): `refuse` (default) or `warn`.
"""

from __future__ import annotations

import hashlib
import os
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
    keys: tuple[TrustedKey, ...] = ()
    unsigned: Unsigned = "refuse"

    @property
    def enforced(self) -> bool:
        return bool(self.keys)

    def named(self) -> str:
        return ", ".join(f"{k.label} ({k.fingerprint[:16]})" for k in self.keys) or "none"


def signing_key(cfg: SigningConfig, base: Path, environ: Mapping[str, str] | None = None
                ) -> SigningKey | None:
    """The release's signing key, loaded and checked; None when none is configured. InputError (exit 2),
    naming the path or the variable only, when it is missing, unreadable or not an EC private key.
    `base`: release.yaml's folder, which signing.key is relative to."""
    env = os.environ if environ is None else environ
    value = env.get(KEY_ENV, "").strip()
    if value.startswith(_PEM):
        label, pem = f"${KEY_ENV}", value.encode()
    else:
        where = value or cfg.key
        if not where:
            return None
        path = Path(where) if Path(where).is_absolute() or value else base / where
        label = f"{path} (from ${KEY_ENV})" if value else f"{path} (signing.key)"
        pem = _read(path, label, "signing key")
    password = env.get(PASSWORD_ENV)
    public = _private_key_public_pem(pem, password.encode() if password else None, label)
    return SigningKey(label, pem, password.encode() if password else None, fingerprint(public))


def _read(path: Path, label: str, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} {label}: no such file",
                         hint=f"set signing.key in release.yaml or {KEY_ENV} to a PEM key file") from None
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
    paths = [base / p if not Path(p).is_absolute() else Path(p) for p in cfg.trusted_keys]
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
    return Trust(tuple(keys), "warn" if unsigned == "warn" else "refuse")


def signing_problem(cfg: SigningConfig, base: Path, environ: Mapping[str, str] | None = None
                    ) -> tuple[str, str] | None:
    """(message, hint) when the configured signing key or a trusted key cannot be used: `relctl check` and
    promote's first step report it before any slow stage."""
    try:
        signing_key(cfg, base, environ)
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
    return signing_key(load_config(project_config(project_dir)).signing, project_dir, environ)
