"""Signed by default and bound to the version (issue 31), on a real MLflow SQLite store, real packages and keys.

Every test here starts from a project as `relctl keygen` (what `relctl init` and `make demo` run) leaves it,
with nothing set by hand: no RELCTL_* variable, no `signing:` block.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.commands import api
from release.core.errors import InputError
from release.core.hashing import sha256_file, sha256_json
from release.core.package import MANIFEST, SIGNATURE
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.signing.keys import DEFAULT_KEY, DEFAULT_PUBLIC, KEY_ENV, PASSWORD_ENV, TRUSTED_ENV, UNSIGNED_ENV
from tests.signing.test_signing import MODEL, RELCTL, _artifact_root, _attack, _env, _keypair, _package

REPO = Path(__file__).resolve().parents[2]


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.fixture()
def fresh(project_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with its key pair from `relctl keygen` and nothing else set."""
    for name in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV, PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    made = relctl(project_dir, "keygen")
    assert made.exit_code == 0, made.output
    return project_dir


def _register(project: Path, tmp: Path, n: int, model: str = MODEL) -> str:
    version, _run = api.register(_package(tmp, n), model, project, production=True)
    return version


def _replace_package(registry: Registry, model: str, version: str, source: Path) -> None:
    """The attacker's move: another signed package copied into this version's artifact location, and the
    registry's digests rewritten to match it (so the manifest check passes)."""
    run_id = registry.get_version(model, version).run_id
    target = Path(registry.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "package"
    shutil.rmtree(target)
    shutil.copytree(source, target)
    manifest = json.loads((target / MANIFEST).read_text())
    registry.set_version_tags(model, version, {T.MANIFEST_SHA256: sha256_file(target / MANIFEST),
                                               T.CONTENT_SHA256: sha256_json(manifest["files"])})


def test_keygen_writes_a_private_key_only_its_owner_reads_and_a_public_key_to_commit(fresh: Path) -> None:
    private, public = fresh / DEFAULT_KEY, fresh / DEFAULT_PUBLIC
    assert private.stat().st_mode & 0o777 == 0o600
    assert ".relctl/" in (fresh / ".gitignore").read_text().splitlines()
    assert b"PRIVATE KEY" not in public.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    again = relctl(fresh, "keygen")
    assert again.exit_code == 2 and "already exist" in again.stderr
    assert relctl(fresh, "keygen", "--if-missing").exit_code == 0


def test_the_reanchor_attack_is_refused_with_nothing_set_by_hand(fresh: Path, tmp_path: Path) -> None:
    """The issue's attack on a project as `make demo` makes it: a served file changed, the manifest rewritten,
    the digest tags re-anchored. Both releases are signed; serve and rollback refuse with exit 2 naming the file."""
    v1 = _register(fresh, tmp_path, 1)
    v2 = _register(fresh, tmp_path, 2)
    registry = Registry(resolve_store(fresh))
    for version in (v1, v2):
        assert (_artifact_root(registry, version) / SIGNATURE).is_file()
        assert registry.get_version(MODEL, version).tags[T.SIGNED_BY] != "unsigned"
    _attack(registry, v1)
    expected = f"error: {MODEL} v{v1}: model/genai_config.json differs from the signed package"
    rolled = relctl(fresh, "rollback", MODEL)
    assert rolled.exit_code == 2, rolled.output
    assert rolled.stderr.splitlines()[0].startswith(expected)
    assert registry.aliases(MODEL)["production"] == v2
    env = {k: v for k, v in _env(fresh).items() if k not in (KEY_ENV, TRUSTED_ENV)}
    served = subprocess.run([*RELCTL, "--project-dir", str(fresh), "serve", f"{MODEL}/{v1}", "--port", "0"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert served.returncode == 2, served.stderr
    assert served.stderr.splitlines()[0].startswith(expected)


def test_a_project_without_a_key_is_refused_with_the_command_that_makes_one(
        project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY_ENV, TRUSTED_ENV):
        monkeypatch.delenv(name, raising=False)
    result = relctl(project_dir, "register", str(_package(tmp_path, 1)), "--model", MODEL, "--production")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].startswith("error: no release signing key:")
    assert "relctl keygen" in result.stderr
    assert not Registry(resolve_store(project_dir)).model_exists(MODEL)  # nothing registered, nothing moved


def test_register_under_signing_signs_like_promote(fresh: Path, tmp_path: Path) -> None:
    result = relctl(fresh, "register", str(_package(tmp_path, 1)), "--model", MODEL, "--production", "--json")
    assert result.exit_code == 0, result.output
    verified = relctl(fresh, "verify", f"{MODEL}/1", "--json")
    assert verified.exit_code == 0, verified.output
    provenance = json.loads(verified.stdout)["provenance"]
    assert (provenance["model"], provenance["builder"]) == (MODEL, "relctl register")
    registry = Registry(resolve_store(fresh))
    assert provenance["release_run"] == registry.get_version(MODEL, "1").run_id
    status = relctl(fresh, "status", MODEL)
    assert "signed by key" in status.stdout


def test_another_versions_signed_package_is_refused_naming_both(fresh: Path, tmp_path: Path) -> None:
    """Replaying old signed bytes: v1's package (signed, same model) in v2's place, digests re-anchored."""
    v1 = _register(fresh, tmp_path, 1)
    v2 = _register(fresh, tmp_path, 2)
    registry = Registry(resolve_store(fresh))
    v1_run = registry.get_version(MODEL, v1).run_id
    _replace_package(registry, MODEL, v2, _artifact_root(registry, v1))
    expected = (f"error: {MODEL} v{v2}: the package is signed for {MODEL} v{v1} (release run {v1_run}), not for "
                f"{MODEL} v{v2}")
    for args in (["verify", f"{MODEL}/{v2}"], ["trace", f"{MODEL}:{v2}"]):
        result = relctl(fresh, *args)
        assert result.exit_code != 0
        assert expected.removeprefix("error: ") in result.output, result.output
    relctl(fresh, "rollback", MODEL)  # production v1; back to v2 must be refused
    back = relctl(fresh, "rollback", MODEL, "--to", v2)
    assert back.exit_code == 2
    assert back.stderr.splitlines()[0].startswith(expected)
    assert registry.aliases(MODEL)["production"] == v1


def test_another_models_signed_package_is_refused_naming_both(fresh: Path, tmp_path: Path) -> None:
    v1 = _register(fresh, tmp_path, 1)
    other = _register(fresh, tmp_path, 2, model="other-llm")
    registry = Registry(resolve_store(fresh))
    other_root = Path(registry.client.get_run(registry.get_version("other-llm", other).run_id)
                      .info.artifact_uri.removeprefix("file://")) / "package"
    _replace_package(registry, MODEL, v1, other_root)
    result = relctl(fresh, "verify", f"{MODEL}/{v1}")
    assert result.exit_code == 2
    line = result.stderr.splitlines()[0]
    assert line.startswith(f"error: {MODEL} v{v1}: the package is signed for model other-llm")
    assert f"not for {MODEL} v{v1}" in line
    env = {k: v for k, v in _env(fresh).items() if k not in (KEY_ENV, TRUSTED_ENV)}
    served = subprocess.run([*RELCTL, "--project-dir", str(fresh), "serve", f"{MODEL}/{v1}", "--port", "0"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert served.returncode == 2 and "signed for model other-llm" in served.stderr


def test_check_refuses_a_signing_key_the_project_does_not_trust(fresh: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from release.config import SigningConfig
    from release.signing.keys import signing_problem

    assert signing_problem(SigningConfig(), fresh) is None
    other, _pub = _keypair(tmp_path, "other")
    monkeypatch.setenv(KEY_ENV, str(other))
    problem = signing_problem(SigningConfig(), fresh)
    assert problem is not None and "is not a trusted key of this project" in problem[0]
    with pytest.raises(InputError, match="is not a trusted key"):
        api.register(_package(tmp_path, 1), MODEL, fresh, production=True)
    assert not Registry(resolve_store(fresh)).model_exists(MODEL)


def test_signing_off_says_unsigned_in_words(project_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY_ENV, TRUSTED_ENV):
        monkeypatch.delenv(name, raising=False)
    (project_dir / "release.yaml").write_text("signing: off\n")
    v1 = _register(project_dir, tmp_path, 1)
    status = relctl(project_dir, "status", MODEL)
    assert "unsigned" in status.stdout
    verified = relctl(project_dir, "verify", f"{MODEL}/{v1}")   # fails closed: nothing vouches for the manifest
    assert verified.exit_code == 2 and "no signature was verified" in verified.stderr
    assert "signing: off" in verified.stderr and verified.stdout == ""
    history = relctl(project_dir, "history", MODEL)
    assert history.stdout.splitlines()[0].startswith("unsigned:")
    card = Registry(resolve_store(project_dir)).get_version(MODEL, v1).description
    assert "**Signature**: unsigned" in card


def test_relctl_sign_moves_unsigned_versions_to_signing(project_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY_ENV, TRUSTED_ENV):
        monkeypatch.delenv(name, raising=False)
    (project_dir / "release.yaml").write_text("signing: off\n")
    v1 = _register(project_dir, tmp_path, 1)
    (project_dir / "release.yaml").write_text("")
    assert relctl(project_dir, "keygen").exit_code == 0
    refused = relctl(project_dir, "verify", f"{MODEL}/{v1}")
    assert refused.exit_code == 2 and "unsigned" in refused.stderr
    signed = relctl(project_dir, "sign", MODEL)
    assert signed.exit_code == 0, signed.output
    assert f"{MODEL} v{v1}: signed" in signed.stdout
    verified = relctl(project_dir, "verify", f"{MODEL}/{v1}", "--json")
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)["provenance"]["builder"] == "relctl sign"
    assert "already signed" in relctl(project_dir, "sign", MODEL).stdout


def test_the_image_entrypoint_refuses_to_serve_when_it_trusts_no_key_or_the_package_was_tampered(
        fresh: Path, tmp_path: Path) -> None:
    """templates/Dockerfile's ENTRYPOINT as the container runs it (no release.yaml in its project folder): with
    no trusted key mounted it serves nothing, and with the key a tampered version is exit 2 naming the file."""
    import os
    import sys

    from release.core.templates import templates_dir
    from tests.deploy.test_kserve import dockerfile_exec

    v1 = _register(fresh, tmp_path, 1)
    _register(fresh, tmp_path, 2)
    entrypoint = dockerfile_exec(templates_dir() / "Dockerfile", "ENTRYPOINT")
    cache = tmp_path / "cache"
    cache.mkdir()
    base = {**{k: v for k, v in _env(fresh).items() if not k.startswith("MLFLOW_")},
            "MLFLOW_TRACKING_URI": f"sqlite:///{fresh / '.relctl' / 'mlflow.db'}", "RELCTL_PROJECT_DIR": str(cache),
            "PORT": "0", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    untrusting = subprocess.run([*entrypoint, f"{MODEL}/{v1}"], env=base, capture_output=True, text=True,
                                timeout=120, check=False)
    assert untrusting.returncode == 2, untrusting.stderr[-2000:]
    assert "this project trusts no release key" in untrusting.stderr
    _attack(Registry(resolve_store(fresh)), v1)
    tampered = subprocess.run([*entrypoint, f"{MODEL}/{v1}"], env={**base, TRUSTED_ENV: str(fresh / DEFAULT_PUBLIC)},
                              capture_output=True, text=True, timeout=120, check=False)
    assert tampered.returncode == 2, tampered.stderr[-2000:]
    assert f"{MODEL} v{v1}: model/genai_config.json differs from the signed package" in tampered.stderr


def test_init_makes_a_project_whose_first_release_is_signed(project_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY_ENV, TRUSTED_ENV):
        monkeypatch.delenv(name, raising=False)
    subprocess.run(["git", "init", "-q", str(project_dir)], check=True, timeout=30)
    made = relctl(project_dir, "init")
    assert made.exit_code == 0, made.output
    assert "release key: .relctl/keys/release.pem" in made.stdout
    private = project_dir / DEFAULT_KEY
    assert private.stat().st_mode & 0o777 == 0o600
    ignored = subprocess.run(["git", "check-ignore", "-q", str(private)], cwd=project_dir, timeout=30, check=False)
    assert ignored.returncode == 0, "the private key must be ignored by git"
    tracked = subprocess.run(["git", "check-ignore", "-q", str(project_dir / DEFAULT_PUBLIC)], cwd=project_dir,
                             timeout=30, check=False)
    assert tracked.returncode == 1, "the public key is committed"
    v1 = _register(project_dir, tmp_path, 1)
    verified = relctl(project_dir, "verify", f"{MODEL}/{v1}")
    assert verified.exit_code == 0 and "verified, signed by release.pub" in verified.stdout
    again = relctl(project_dir, "init", "--force")  # a project that has its key keeps it
    assert again.exit_code == 0 and "release key:" not in again.stdout
