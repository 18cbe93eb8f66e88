"""`relctl keygen`: a project's release key pair, where relctl looks for it by default.

- the private key at `.relctl/keys/release.pem` (mode 0600, its folder 0700): `.relctl/` is git-ignored
  (`relctl init` and this command make sure), so the key never reaches the repository; CI gets the same key
  from a secret (`RELCTL_SIGNING_KEY`);
- its public half at `keys/release.pub`, committed: the project's trusted key, which serve, rollback, the
  canary, the gates, approve, trace, verify and pull check every version against.

Nothing is overwritten: a project whose public key exists already has a release key (its holder, or CI's
secret, signs); `--if-missing` makes a second run a no-op for the demo and for scripts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from release.core.errors import InputError
from release.signing.keys import DEFAULT_KEY, DEFAULT_PUBLIC, fingerprint

GITIGNORE_LINE = ".relctl/"


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    fingerprint: str
    created: bool


def create_keypair(project_dir: Path, *, if_missing: bool = False) -> KeyPair:
    """Make the project's release key pair (EC P-256) at the default paths; InputError (exit 2), writing
    nothing, when either file exists (unless `if_missing` and both exist)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - only when a key is made
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    private, public = project_dir / DEFAULT_KEY, project_dir / DEFAULT_PUBLIC
    if private.exists() and public.exists() and if_missing:
        return KeyPair(private, public, fingerprint(_public_pem_of(public)), created=False)
    dangling = [p for p in (private, public) if p.is_symlink() and not p.exists()]
    if dangling:   # O_EXCL would fail on it (exit 3), and writing through it would put the key wherever it points
        raise InputError(f"{dangling[0]} is a symlink to {os.readlink(dangling[0])}, which does not exist",
                         hint=f"remove the link ({dangling[0]}) or restore what it points to, then run relctl keygen "
                              "again")
    existing = [p for p in (private, public) if p.exists()]
    if existing:
        raise InputError(f"{', '.join(str(p) for p in existing)} already exist{'s' if len(existing) == 1 else ''}: "
                         "this project has a release key",
                         hint="sign with it (CI: the RELCTL_SIGNING_KEY secret); to replace it, move both files "
                              "away first and see docs/signing.md (rotating keys)")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    private.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(private.parent, 0o700)
    # Created 0600 from the start (O_EXCL): the key is never readable by others, not even for a moment.
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public.parent.mkdir(parents=True, exist_ok=True)
    public.write_bytes(pub)
    ensure_gitignored(project_dir)
    return KeyPair(private, public, fingerprint(pub), created=True)


def _public_pem_of(path: Path) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    key = serialization.load_pem_public_key(path.read_bytes())
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def ensure_gitignored(project_dir: Path) -> str:
    """`.relctl/` (the store and the private key) in the project's .gitignore: created, appended or unchanged."""
    path = project_dir / ".gitignore"
    if not path.exists():
        path.write_text(f"# relctl's embedded store, stage outputs, logs and the release key\n{GITIGNORE_LINE}\n")
        return "created"
    text = path.read_text()
    if any(line.strip() in (GITIGNORE_LINE, GITIGNORE_LINE.rstrip("/")) for line in text.splitlines()):
        return "unchanged"
    path.write_text(text + ("" if text.endswith("\n") or not text else "\n") + f"{GITIGNORE_LINE}\n")
    return "appended"
