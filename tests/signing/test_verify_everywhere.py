"""The attack of issue 20 against the two readers tests/signing/test_signing.py does not cover: the gates (the
production version a promote compares with, and `relctl gate` on package folders) and `relctl trace`.

The attack: append a byte to model/genai_config.json, rewrite relctl-package.json to match and (for a
registered version) the registry's manifest and content digests. Only the signature still tells.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.commands import api
from release.core.errors import InputError
from release.core.hashing import sha256_tree
from release.core.package import MANIFEST, PROVENANCE, SIGNATURE
from release.gating.run import production_ref
from release.registry import Registry
from release.registry.store import resolve_store
from release.signing.keys import KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV, project_signing_key, project_trust
from release.signing.package import sign_package
from tests.signing.test_signing import MODEL, _attack, _keypair, _package


@pytest.fixture()
def signed(project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV):
        monkeypatch.delenv(name, raising=False)
    keys = tmp_path / "keys"
    keys.mkdir()
    private, public = _keypair(keys, "release")
    (project_dir / "release.yaml").write_text(f"signing:\n  key: {private}\n  trusted_keys: [{public}]\n")
    return project_dir


def _tamper_folder(root: Path) -> None:
    with (root / "model" / "genai_config.json").open("ab") as fh:
        fh.write(b" ")
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"] = sha256_tree(root, exclude=frozenset({MANIFEST, SIGNATURE, PROVENANCE}))
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def test_the_gates_refuse_a_tampered_production_version_naming_the_file(signed: Path, tmp_path: Path) -> None:
    version, _ = api.register(_package(tmp_path, 1), MODEL, signed, production=True)
    registry = Registry(resolve_store(signed))
    trust = project_trust(signed)
    assert production_ref(registry, MODEL, tmp_path / "ok", trust) is not None  # the untouched one is fine
    _attack(registry, version)
    # What promote calls before its gates compare the candidate with production.
    with pytest.raises(InputError) as refused:
        production_ref(registry, MODEL, tmp_path / "prod", trust)
    assert refused.value.message == (f"{MODEL} v{version}: model/genai_config.json differs from the signed package "
                                     "(signature by release.pub)")


def test_relctl_gate_refuses_a_tampered_signed_package_folder_naming_the_file(signed: Path, tmp_path: Path) -> None:
    package = _package(tmp_path, 1)
    key = project_signing_key(signed)
    assert key is not None
    sign_package(package, key, {"model": MODEL})
    baseline = _package(tmp_path, 2)
    sign_package(baseline, key, {"model": MODEL})
    _tamper_folder(baseline)
    for args, name in ((["gate", "safety", str(baseline)], baseline.name),
                       (["gate", "safety", str(package), "--baseline", str(baseline)], baseline.name)):
        result = CliRunner().invoke(cli, ["--project-dir", str(signed), *args])
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines()[0] == (f"error: {name}: model/genai_config.json differs from the signed "
                                                 "package (signature by release.pub)")
        assert not (signed / ".relctl" / "gate-runs" / "safety" / "report.html").exists()  # the gate never ran


def test_trace_refuses_the_attack_in_one_line_naming_the_file(signed: Path, tmp_path: Path) -> None:
    version, _ = api.register(_package(tmp_path, 1), MODEL, signed, production=True)
    registry = Registry(resolve_store(signed))
    runner = CliRunner()
    ok = runner.invoke(cli, ["--project-dir", str(signed), "trace", f"{MODEL}:{version}"])
    assert ok.exit_code == 0, ok.output
    _attack(registry, version)
    result = runner.invoke(cli, ["--project-dir", str(signed), "trace", f"{MODEL}:{version}"])
    # trace's documented exit for a package that no longer matches its release: 1, one error line
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == (f"error: {MODEL} v{version}: model/genai_config.json differs from the "
                                             "signed package (signature by release.pub)")
    data = json.loads(runner.invoke(cli, ["--project-dir", str(signed), "trace", f"{MODEL}:{version}",
                                          "--json"]).stdout)
    assert data["integrity"]["ok"] is False and "signature" not in data  # no verdict for a refused package


def test_the_changed_file_is_named_whichever_quotes_the_upstream_message_uses() -> None:
    """model-signing's ValueError carries a list's repr: a message holding both quote kinds (a digest's bytes
    may contain `"`) has its single quotes escaped, so the file name must be found in either form."""
    from release.signing.package import _changed_file

    plain = "Signature mismatch: [\"Hash mismatch for 'model/genai_config.json': Expected 'Digest(...)'\"]"
    escaped = ("Signature mismatch: ['Hash mismatch for \\'model/genai_config.json\\': Expected \\'Digest("
               "algorithm=\\'sha256\\', digest_value=b\"\\\\xc8\")\\'', \"Hash mismatch for 'relctl-package.json'\"]")
    for message in (plain, escaped):
        assert _changed_file(message) == "model/genai_config.json differs from the signed package"
