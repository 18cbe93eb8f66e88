"""Keys handled like keys (issue 31, item 5): RELCTL_SIGNING_KEY as CI secrets come (PEM, quoted PEM, PEM after a
comment, `\\n`-escaped PEM, base64), refused in one line naming the variable and never its value; a private key
file readable by group or others refused with the chmod that fixes it; no output, log or stored file holds any
encoding of the key."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization

from release.cli import cli
from release.config import SigningConfig
from release.core.errors import InputError
from release.signing.keys import KEY_ENV, TRUSTED_ENV, signing_key
from tests.conftest import load_train_module
from tests.signing.test_signing import MODEL, _keypair, _package


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def encodings(private: Path) -> list[bytes]:
    """Every form the key could leak in: the PEM, its base64 body (whole and per line), base64 of the PEM, the
    DER bytes and their hex, and the private scalar in hex."""
    pem = private.read_bytes()
    key = serialization.load_pem_private_key(pem, None)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    body_lines = [line for line in pem.splitlines() if len(line) >= 16 and not line.startswith(b"-----")]
    scalar = format(key.private_numbers().private_value, "x").encode()  # type: ignore[union-attr]
    return [pem, b"".join(body_lines), *body_lines, base64.b64encode(pem), base64.b64encode(pem)[8:48],
            der, der.hex().encode(), scalar]


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "keys"
    folder.mkdir()
    private, public = _keypair(folder, "release")
    return {"private": private, "public": public}


@pytest.mark.parametrize("form", ["pem", "quoted", "comment", "escaped", "base64", "base64-wrapped", "der-base64"])
def test_a_key_from_the_environment_is_recognised_in_every_form_ci_secrets_take(
        keys: dict[str, Path], tmp_path: Path, form: str) -> None:
    pem = keys["private"].read_text()
    der = serialization.load_pem_private_key(pem.encode(), None).private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    value = {"pem": pem, "quoted": f'"{pem.strip()}"', "comment": f"# the release key\n{pem}",
             "escaped": pem.strip().replace("\n", "\\n"), "base64": base64.b64encode(pem.encode()).decode(),
             "base64-wrapped": base64.encodebytes(pem.encode()).decode(),
             "der-base64": base64.b64encode(der).decode()}[form]
    expected = signing_key(SigningConfig(key=str(keys["private"])), tmp_path, {})
    loaded = signing_key(SigningConfig(), tmp_path, {KEY_ENV: value})
    assert loaded is not None and expected is not None
    assert loaded.fingerprint == expected.fingerprint and loaded.label == f"${KEY_ENV}"


@pytest.mark.parametrize("bad", ["not a key at all", "bm90IGEga2V5", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END "
                                 "PRIVATE KEY-----", "/no/such/file.pem"])
def test_a_value_that_is_no_key_is_refused_naming_the_variable_only(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InputError) as caught:
        signing_key(SigningConfig(), tmp_path, {KEY_ENV: bad})
    text = f"{caught.value.message} {caught.value.hint}"
    assert f"${KEY_ENV}" in text
    assert bad not in text and "AAAA" not in text and "bm90IGEga2V5" not in text


def test_a_private_key_others_can_read_is_refused_with_the_chmod_that_fixes_it(keys: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    keys["private"].chmod(0o644)
    with pytest.raises(InputError) as caught:
        signing_key(SigningConfig(key=str(keys["private"])), tmp_path, {})
    assert caught.value.message == (f"signing key {keys['private']} (signing.key) is readable by group or others "
                                    "(mode 0644)")
    assert caught.value.hint == f"chmod 600 {keys['private']}"
    with pytest.raises(InputError, match="readable by group or others"):  # the same for a path in the variable
        signing_key(SigningConfig(), tmp_path, {KEY_ENV: str(keys["private"])})
    keys["private"].chmod(0o600)
    assert signing_key(SigningConfig(key=str(keys["private"])), tmp_path, {}) is not None


def _everything_written(project: Path, results: list[Result]) -> list[tuple[str, bytes]]:
    found = [(f"output {i}", (r.stdout + r.stderr).encode()) for i, r in enumerate(results)]
    found += [(str(p), p.read_bytes()) for p in project.rglob("*") if p.is_file() and not p.is_symlink()]
    return found


def test_no_output_log_report_or_stored_file_holds_the_key(
        project_dir: Path, keys: dict[str, Path], tiny_run: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """check and register with the key as base64 in the environment (as CI passes it), then with values that
    are no key but are made of it (cut base64, a broken PEM): every byte written anywhere is searched for
    every encoding of the key."""
    monkeypatch.setenv(TRUSTED_ENV, str(keys["public"]))
    pem = keys["private"].read_text()
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment=MODEL)
    monkeypatch.setenv(KEY_ENV, base64.b64encode(pem.encode()).decode())
    results = [relctl(project_dir, "check", run_id),
               relctl(project_dir, "register", str(_package(tmp_path, 1)), "--model", MODEL, "--production")]
    assert results[1].exit_code == 0, results[1].output
    broken = [base64.b64encode(pem.encode()).decode()[:-30], pem.replace("\n", " ")[:-40],
              "# release key\n" + pem[:-60]]
    second = _package(tmp_path, 2)
    for value in broken:
        monkeypatch.setenv(KEY_ENV, value)
        for args in (("check", run_id), ("register", str(second), "--model", MODEL)):
            result = relctl(project_dir, *args)
            assert result.exit_code == 2, result.output
            assert f"${KEY_ENV}" in result.stderr
            results.append(result)
    leaks = [(where, i) for where, data in _everything_written(project_dir, results)
             for i, secret in enumerate(encodings(keys["private"])) if secret in data]
    assert leaks == []
