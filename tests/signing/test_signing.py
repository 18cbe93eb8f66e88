"""Release signatures (OpenSSF model-signing) on a real MLflow SQLite store, real packages and real keys.

The attack (issue 20): someone with write access to the artifact store and the registry appends a byte to
a released version's model/genai_config.json, rewrites relctl-package.json to match and sets the version's
manifest and content sha256 tags to the new digests. The registry digests then vouch for the tampered
bytes; the signature, made with a key the attacker does not hold, does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from onnx import TensorProto, helper

from release.backends import backend_for_folder
from release.cli import cli
from release.commands import api
from release.core.errors import InputError
from release.core.hashing import sha256_file, sha256_json, sha256_tree
from release.core.package import MANIFEST, PROVENANCE, SIGNATURE, build_package
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.serving.source import resolve_package
from release.signing.keys import KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV

MODEL = "signed-model"
RELCTL = [sys.executable, "-c", "from release.cli import main; main()"]


def _keypair(folder: Path, name: str) -> tuple[Path, Path]:
    """An EC P-256 key pair as PEM files (what `openssl ecparam -name prime256v1 -genkey` gives)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    private.chmod(0o600)  # a private key readable by others is refused
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _package(tmp: Path, n: int) -> Path:
    runtime, source = tmp / f"rt{n}", tmp / f"src{n}"
    runtime.mkdir()
    source.mkdir()
    (runtime / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "n": n}}))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], f"g{n}", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(runtime / "model.onnx"))
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    package = build_package(tmp / f"pkg{n}", runtime, source, {"model_name": MODEL, "precision": "fp32"},
                            backend_for_folder(runtime))
    return package.root


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "keys"
    folder.mkdir()
    release_key, release_pub = _keypair(folder, "release")
    other_key, other_pub = _keypair(folder, "other")
    return {"release": release_key, "release_pub": release_pub, "other": other_key, "other_pub": other_pub}


@pytest.fixture()
def signed_project(project_dir: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose release.yaml signs with release.pem and trusts release.pub only."""
    for name in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV):
        monkeypatch.delenv(name, raising=False)
    (project_dir / "release.yaml").write_text(
        f"signing:\n  key: {keys['release']}\n  trusted_keys: [{keys['release_pub']}]\n")
    return project_dir


def _register(project_dir: Path, tmp: Path, n: int) -> str:
    version, _run = api.register(_package(tmp, n), MODEL, project_dir, production=True)
    return version


def _artifact_root(registry: Registry, version: str) -> Path:
    run_id = registry.get_version(MODEL, version).run_id
    return Path(registry.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "package"


def _attack(registry: Registry, version: str) -> None:
    """Append a byte to a model file, rewrite the manifest to match, rewrite the registry's digests."""
    root = _artifact_root(registry, version)
    with (root / "model" / "genai_config.json").open("ab") as fh:
        fh.write(b" ")
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"] = sha256_tree(root, exclude=frozenset({MANIFEST, SIGNATURE, PROVENANCE}))
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    registry.set_version_tags(MODEL, version, {T.MANIFEST_SHA256: sha256_file(root / MANIFEST),
                                               T.CONTENT_SHA256: sha256_json(manifest["files"])})


def _env(project_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV)}
    return {**env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])}


def test_the_attack_is_refused_by_serve_rollback_and_the_canary_naming_the_file(
        signed_project: Path, tmp_path: Path) -> None:
    v1 = _register(signed_project, tmp_path, 1)
    v2 = _register(signed_project, tmp_path, 2)
    registry = Registry(resolve_store(signed_project))
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}
    _attack(registry, v1)
    expected = f"error: {MODEL} v{v1}: model/genai_config.json differs from the signed package"

    # rollback: exit 2, one line naming the file, production unmoved
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "rollback", MODEL])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0].startswith(expected)
    assert registry.aliases(MODEL) == {"production": v2, "previous": v1}

    # serve (the real CLI, a process of its own): refused before anything loads or listens
    served = subprocess.run([*RELCTL, "--project-dir", str(signed_project), "serve", f"{MODEL}/{v1}", "--port", "0"],
                            capture_output=True, text=True, timeout=120, env=_env(signed_project))
    assert served.returncode == 2, served.stderr
    assert served.stderr.splitlines()[0].startswith(expected)

    # the canary: refused before either side is served, and `candidate` never set
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "canary", MODEL, "--version", v1])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0].startswith(expected)
    assert "candidate" not in registry.aliases(MODEL)

    # relctl verify says the same on its own
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "verify", f"{MODEL}/{v1}"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0].startswith(expected)


def test_a_package_signed_by_an_untrusted_key_is_refused_naming_the_signer(
        signed_project: Path, tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    v1 = _register(signed_project, tmp_path, 1)
    monkeypatch.setenv(KEY_ENV, keys["other"].read_text())  # the PEM itself, as a CI secret passes it
    second = _package(tmp_path, 2)
    with pytest.raises(InputError, match="is not a trusted key of this project"):  # register refuses it first
        api.register(second, MODEL, signed_project, production=True)
    monkeypatch.setenv(TRUSTED_ENV, str(keys["other_pub"]))  # trusted while it signs, then no longer
    v2, _run = api.register(second, MODEL, signed_project, production=True)
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.delenv(TRUSTED_ENV)
    registry = Registry(resolve_store(signed_project))
    other_fp = json.loads((_artifact_root(registry, v2) / SIGNATURE).read_text())[
        "verificationMaterial"]["publicKey"]["hint"]
    # production is v2 (signed by `other`): a rollback to v1 is fine, a move back to v2 is refused
    assert api.rollback(MODEL, signed_project, "test").changes["production"] == [v2, v1]
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "rollback", MODEL, "--to", v2])
    assert result.exit_code == 2
    line = result.stderr.splitlines()[0]
    assert line == f"error: {MODEL} v{v2}: signed by key {other_fp[:16]}, which is not a trusted key"
    assert "release.pub" in result.stderr  # the hint names the trusted keys
    with pytest.raises(InputError, match=f"signed by key {other_fp[:16]}"):
        resolve_package(f"{MODEL}/{v2}", signed_project, {})
    # trusting `other` too (RELCTL_TRUSTED_KEYS, beside release.yaml's) lets it through
    monkeypatch.setenv(TRUSTED_ENV, str(keys["other_pub"]))
    assert resolve_package(f"{MODEL}/{v2}", signed_project, dict(os.environ)).identity.version == v2


def test_a_release_verifies_with_upstream_model_signing_and_relctl_verify(
        signed_project: Path, tmp_path: Path, keys: dict[str, Path]) -> None:
    v1 = _register(signed_project, tmp_path, 1)
    registry = Registry(resolve_store(signed_project))
    root = _artifact_root(registry, v1)
    # Without relctl: the model-signing CLI with the public key alone.
    upstream = subprocess.run([str(Path(sys.executable).parent / "model_signing"), "verify", "key", "--signature",
                               str(root / SIGNATURE), "--public_key", str(keys["release_pub"]), str(root)],
                              capture_output=True, text=True, timeout=120)
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr
    # ...and its Python API, which fails on the wrong key
    from model_signing import verifying

    verifying.Config().use_elliptic_key_verifier(public_key=keys["release_pub"]).verify(root, root / SIGNATURE)
    with pytest.raises(ValueError, match="Key mismatch"):
        verifying.Config().use_elliptic_key_verifier(public_key=keys["other_pub"]).verify(root, root / SIGNATURE)

    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "verify", f"{MODEL}/{v1}", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["signed_by"] == "release.pub"
    provenance = data["provenance"]
    release_run = registry.get_version(MODEL, v1).tags[T.RELEASE_RUN]
    assert provenance["release_run"] == release_run
    assert provenance["manifest_sha256"] == registry.get_version(MODEL, v1).tags[T.MANIFEST_SHA256]
    assert provenance["builder"] == "relctl register" and provenance["relctl_version"]
    # relctl trace shows who signed it and what the signature vouches for
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "trace", f"{MODEL}:{v1}"])
    assert result.exit_code == 0, result.output
    assert "signature        verified by release.pub" in result.stdout
    assert f"signed release_run {release_run}" in result.stdout


def test_unsigned_versions_are_refused_for_moves_and_warned_for_a_folder(
        signed_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (signed_project / "release.yaml").write_text("signing: off\n")  # v1 released before signing was set up
    v1 = _register(signed_project, tmp_path, 1)
    (signed_project / "release.yaml").write_text(f"signing:\n  key: {tmp_path / 'keys/release.pem'}\n"
                                                 f"  trusted_keys: [{tmp_path / 'keys/release.pub'}]\n")
    v2 = _register(signed_project, tmp_path, 2)
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "rollback", MODEL])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (f"error: {MODEL} v{v1}: unsigned ({SIGNATURE} missing), and only "
                                             "signed versions serve or move")
    # the policy switch: versions from before signing are let through with a warning
    monkeypatch.setenv(UNSIGNED_ENV, "warn")
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "rollback", MODEL])
    assert result.exit_code == 0, result.output
    assert f"{MODEL} v{v1}: unsigned" in result.output
    assert Registry(resolve_store(signed_project)).aliases(MODEL)["production"] == v1
    monkeypatch.delenv(UNSIGNED_ENV)
    assert v2 != v1
    # a package folder: unsigned is served with a warning
    folder = _package(tmp_path, 3)
    assert resolve_package(str(folder), signed_project, {}).identity.version == "unregistered"


def test_a_missing_or_unreadable_key_fails_first_and_names_only_its_path(
        signed_project: Path, tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere.pem"
    (signed_project / "release.yaml").write_text(f"signing:\n  key: {missing}\n")
    with pytest.raises(InputError, match=f"signing key {missing} \\(signing.key\\): no such file"):
        _register(signed_project, tmp_path, 1)
    assert not Registry(resolve_store(signed_project)).model_exists(MODEL)  # nothing was written
    # a PEM in the env that is not a private key: named as the variable, its content never shown
    monkeypatch.setenv(KEY_ENV, keys["release_pub"].read_text())
    result = CliRunner().invoke(cli, ["--project-dir", str(signed_project), "register", str(_package(tmp_path, 2)),
                                      "--model", MODEL])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"error: signing key ${KEY_ENV}: not a PEM private key"
    assert "BEGIN" not in result.output


def test_the_private_key_never_reaches_a_log_tag_artifact_or_output(
        signed_project: Path, tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    pem = keys["release"].read_text()
    body = "".join(pem.strip().splitlines()[1:-1])
    monkeypatch.setenv(KEY_ENV, pem)  # the key as CI passes it: the PEM in the environment
    runner = CliRunner()
    outputs = []
    for n in (1, 2):
        result = runner.invoke(cli, ["--project-dir", str(signed_project), "register", str(_package(tmp_path, n)),
                                     "--model", MODEL, "--production"])
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    for args in (["verify", f"{MODEL}/1"], ["trace", f"{MODEL}:1"], ["history", MODEL], ["status", MODEL],
                 ["rollback", MODEL], ["trace", f"{MODEL}:2", "--json"]):
        result = runner.invoke(cli, ["--project-dir", str(signed_project), *args])
        assert result.exit_code == 0, (args, result.output)
        outputs.append(result.output)
    registry = Registry(resolve_store(signed_project))
    texts = [("output", "\n".join(outputs))]
    texts += [(str(p), p.read_bytes().decode("utf-8", "replace")) for p in signed_project.rglob("*") if p.is_file()]
    for mv in registry.client.search_model_versions(f"name='{MODEL}'"):
        texts.append((f"v{mv.version}", f"{mv.tags} {mv.description} {mv.source}"))
    assert any(path.endswith(SIGNATURE) for path, _ in texts), "nothing was signed"
    for chunk in (body[:40], body[40:80], body[-40:]):
        leaks = [where for where, text in texts if chunk in text]
        assert not leaks, f"the private key appears in {leaks}"
