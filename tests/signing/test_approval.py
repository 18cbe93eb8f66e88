"""Approvals (issue 20, item 3) and a full signed promote, on real training runs, real MLflow and real keys.

With `require_approval`, a version that passed its gates waits as `candidate`; production moves only when
`relctl approve MODEL/VERSION --reason ...` records who approved it (signed with the release key). The
same promote is the one full release with a signing key configured: its version verifies with `relctl
verify` and with the upstream model_signing CLI, without relctl.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.package import SIGNATURE
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.signing.approval import USER_ENV, parse_statement, verify_approval
from release.signing.keys import KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV, project_trust
from tests.conftest import load_train_module
from tests.signing.test_signing import MODEL as PKG_MODEL
from tests.signing.test_signing import _artifact_root, _attack, _keypair, _package

MODEL = "tiny-llm"
pytestmark = pytest.mark.slow


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.fixture(scope="module")
def awaiting(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    """One real promote of the example's run, signed with release.pem, under require_approval, with a gate."""
    with pytest.MonkeyPatch.context() as mp:
        for name in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV, USER_ENV):
            mp.delenv(name, raising=False)
        project = tmp_path_factory.mktemp("approval")
        keys = project / "keys"
        keys.mkdir()
        private, public = _keypair(keys, "release")
        (project / "release.yaml").write_text(
            f"model: {MODEL}\nconvert:\n  precision: fp32\nrequire_approval: true\n"
            f"signing:\n  key: keys/release.pem\n  trusted_keys: [keys/release.pub]\n"
            "gates:\n  safety:\n    max_rate: {harmful: 0.0}\nrequire: [safety]\n")
        run_id = load_train_module().log_run(tiny_run, project, experiment=MODEL)
        promoted = relctl(project, "promote", run_id, "--json")
        # A repeated dispatch of the same run while v1 waits: the gates re-run, and v1 stays the one to approve.
        again = relctl(project, "promote", run_id, "--json")
    return {"project": project, "private": private, "public": public, "run": run_id, "promoted": promoted,
            "again": again}


def test_a_full_signed_release_verifies_with_relctl_verify_and_the_upstream_cli(awaiting: dict[str, Any]) -> None:
    project, promoted = awaiting["project"], awaiting["promoted"]
    assert promoted.exit_code == 0, promoted.output
    registry = Registry(resolve_store(project))
    mv = registry.get_version(MODEL, "1")
    stored = Path(registry.client.get_run(mv.run_id).info.artifact_uri.removeprefix("file://")) / "package"
    assert (stored / SIGNATURE).is_file()
    # The registry stores the weights once (in the MLflow model, release/registry/package_links.py): the
    # whole signed package is what `relctl pull` assembles, and that is what the upstream CLI checks.
    root = awaiting["project"] / "pulled"
    pulled = relctl(project, "pull", f"{MODEL}/1", "--to", str(root))
    assert pulled.exit_code == 0, pulled.output
    # Without relctl: OpenSSF model-signing's own CLI and the public key alone.
    upstream = subprocess.run([str(Path(sys.executable).parent / "model_signing"), "verify", "key", "--signature",
                               str(root / SIGNATURE), "--public_key", str(awaiting["public"]), str(root)],
                              capture_output=True, text=True, timeout=300)
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr
    result = relctl(project, "verify", f"{MODEL}/1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["signed_by"] == "release.pub"
    # The provenance of a promote: the training run, its data, the release run and the gate that passed.
    provenance = data["provenance"]
    assert provenance["training_run"] == awaiting["run"]
    assert provenance["release_run"] == mv.tags[T.RELEASE_RUN]
    assert provenance["builder"] == "relctl promote"
    assert provenance["gates"] == {"safety": "pass"}
    assert provenance["data_sha256"] and provenance["weights_sha256"]
    # One byte more in a model file and the upstream CLI names it too.
    tampered = root.parent / "tampered"
    shutil.copytree(root, tampered)
    with (tampered / "model" / "genai_config.json").open("ab") as fh:
        fh.write(b" ")
    upstream = subprocess.run([str(Path(sys.executable).parent / "model_signing"), "verify", "key", "--signature",
                               str(tampered / SIGNATURE), "--public_key", str(awaiting["public"]), str(tampered)],
                              capture_output=True, text=True, timeout=300)
    assert upstream.returncode != 0
    assert "genai_config.json" in upstream.stdout + upstream.stderr


def test_production_waits_for_relctl_approve_which_names_and_signs_the_approver(
        awaiting: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    project, promoted = awaiting["project"], awaiting["promoted"]
    assert promoted.exit_code == 0, promoted.output
    report = json.loads(promoted.stdout)
    assert report["outcome"] == "awaiting-approval" and report["version"] == "1"
    # The progress line says what the candidate waits for (no canary here: the approval).
    assert "is the candidate (waits for an approval: relctl approve)" in promoted.stderr
    registry = Registry(resolve_store(project))
    again = awaiting["again"]
    assert again.exit_code == 0, again.output
    assert (json.loads(again.stdout)["outcome"], json.loads(again.stdout)["version"]) == ("awaiting-approval", "1")
    assert [v.version for v in registry.find_versions(MODEL, T.RELEASE_STATE, "awaiting-approval")] == ["1"]
    assert "waits for an approval" in again.stderr
    # Gates passed, production did not move: the version waits as candidate.
    assert registry.aliases(MODEL) == {"candidate": "1"}
    assert registry.get_version(MODEL, "1").tags[T.RELEASE_STATE] == "awaiting-approval"
    # No other way to production: a rollback to it is refused by the alias rule.
    moved = relctl(project, "rollback", MODEL, "--to", "1")
    assert moved.exit_code == 2
    assert "it is awaiting-approval" in moved.stderr.splitlines()[0]
    assert "production" not in registry.aliases(MODEL)
    # An empty reason is refused before anything is written.
    empty = relctl(project, "approve", f"{MODEL}/1", "--reason", " ")
    assert (empty.exit_code, empty.stderr.splitlines()[0]) == (2, "error: --reason is empty")

    _forged_and_untrusted_approvals_are_refused(project, registry, monkeypatch)

    monkeypatch.setenv(USER_ENV, "alice@example.com")
    approved = relctl(project, "approve", f"{MODEL}/1", "--reason", "reviewed the safety report")
    assert approved.exit_code == 0, approved.output
    assert approved.stdout.startswith(f"{MODEL} v1 approved by alice@example.com ($RELCTL_USER)")
    assert registry.aliases(MODEL) == {"production": "1"}  # candidate cleared, production moved
    mv = registry.get_version(MODEL, "1")
    assert mv.tags[T.RELEASE_STATE] == "released"
    # The history names the approver, as the entry's user and in its reason.
    history = json.loads(relctl(project, "history", MODEL, "--json").stdout)
    last = history[-1]
    assert (last["action"], last["user"], last["changes"]) == ("approve", "alice@example.com",
                                                              {"candidate": ["1", None], "production": [None, "1"]})
    assert last["reason"] == "approved by alice@example.com: reviewed the safety report"
    text = relctl(project, "history", MODEL).stdout.splitlines()[-1]
    assert "approve" in text and "by alice@example.com" in text
    # The card names the approver in one line at its top.
    assert (mv.description or "").splitlines()[0].startswith(
        "**Approved** by alice@example.com ($RELCTL_USER) on ")
    # The approval is signed with the release key: it verifies with the trusted key, an edit does not.
    statement, signature = mv.tags[T.APPROVAL], mv.tags[T.APPROVAL_SIGNATURE]
    data = parse_statement(statement)
    assert (data["approver"], data["version"], data["content_sha256"]) == (
        "alice@example.com", "1", mv.tags[T.CONTENT_SHA256])
    trust = project_trust(project)
    assert verify_approval(statement, signature, trust) == "release.pub"
    from release.core.errors import InputError

    with pytest.raises(InputError, match=r"does not verify with trusted key release\.pub"):
        verify_approval(statement.replace("alice", "mallory"), signature, trust)
    # relctl verify shows the approval with its signature checked; a forged approval tag is refused.
    shown = relctl(project, "verify", f"{MODEL}/1")
    assert shown.exit_code == 0, shown.output
    assert "approved by alice@example.com on " in shown.stdout and "(approval signed by release.pub)" in shown.stdout
    registry.set_version_tags(MODEL, "1", {T.APPROVAL: statement.replace("alice", "mallory")})
    forged = relctl(project, "verify", f"{MODEL}/1")
    assert forged.exit_code == 2 and "does not verify with trusted key release.pub" in forged.stderr
    registry.set_version_tags(MODEL, "1", {T.APPROVAL: statement})
    # Approving it again is refused: it is released.
    again = relctl(project, "approve", f"{MODEL}/1", "--reason", "twice")
    assert again.exit_code == 2
    assert again.stderr.splitlines()[0].startswith(f"error: {MODEL} v1 cannot be approved: it is released")


def _forged_and_untrusted_approvals_are_refused(project: Path, registry: Registry,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """v1 waits for its approval (its signed provenance says require_approval)."""
    # approve with a key the project does not trust: refused before anything is written or moves
    other, _ = _keypair(project, "untrusted")
    monkeypatch.setenv(KEY_ENV, str(other))
    refused = relctl(project, "approve", f"{MODEL}/1", "--reason", "looks fine")
    assert refused.exit_code == 2, refused.output
    assert "is not a trusted key of this project" in refused.stderr.splitlines()[0]
    assert registry.aliases(MODEL) == {"candidate": "1"}
    assert not registry.get_version(MODEL, "1").tags.get(T.APPROVAL)
    monkeypatch.delenv(KEY_ENV)
    # approval tags written by hand, without a signature: not an approval anywhere
    mv = registry.get_version(MODEL, "1")
    statement = json.dumps({"_type": "https://relctl.dev/approval/v1", "model": MODEL, "version": "1",
                            "manifest_sha256": mv.tags[T.MANIFEST_SHA256], "content_sha256": mv.tags[T.CONTENT_SHA256],
                            "approver": "mallory", "approver_source": "$RELCTL_USER", "at": "2026-01-01T00:00:00+00:00",
                            "reason": "trust me", "release_run": mv.tags[T.RELEASE_RUN]}, sort_keys=True)
    registry.set_version_tags(MODEL, "1", {T.APPROVAL: statement, T.APPROVAL_SIGNATURE: "",
                                           T.RELEASE_STATE: "approved"})
    moved = relctl(project, "rollback", MODEL, "--to", "1")
    assert moved.exit_code == 2, moved.output
    assert "not approved: its approval carries no signature" in moved.stderr.splitlines()[0]
    verified = relctl(project, "verify", f"{MODEL}/1")
    assert verified.exit_code == 2 and "not approved" in verified.stderr.splitlines()[0]
    assert "not approved" in relctl(project, "status", MODEL).stdout
    # the state tag rewritten to `released`, no approval at all: the signed provenance still says it needs one
    registry.set_version_tags(MODEL, "1", {T.APPROVAL: "", T.RELEASE_STATE: "released"})
    moved = relctl(project, "rollback", MODEL, "--to", "1")
    assert moved.exit_code == 2 and "not approved" in moved.stderr.splitlines()[0]
    assert "production" not in registry.aliases(MODEL)
    registry.set_version_tags(MODEL, "1", {T.RELEASE_STATE: "awaiting-approval"})


def test_an_approval_of_an_ungated_unknown_rejected_or_tampered_version_is_refused(
        project_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY_ENV, TRUSTED_ENV, UNSIGNED_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(USER_ENV, "bob")
    keys = tmp_path / "keys"
    keys.mkdir()
    private, public = _keypair(keys, "release")
    (project_dir / "release.yaml").write_text(f"signing:\n  key: {private}\n  trusted_keys: [{public}]\n")
    registered = relctl(project_dir, "register", str(_package(tmp_path, 1)), "--model", PKG_MODEL)
    assert registered.exit_code == 0, registered.output
    registry = Registry(resolve_store(project_dir))

    def refused(spec: str) -> str:
        result = relctl(project_dir, "approve", spec, "--reason", "ok")
        assert result.exit_code == 2, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 2 and lines[1].startswith("hint: "), result.stderr  # one error line, one hint
        return lines[0]

    # registered with relctl register: no gate ran
    assert refused(f"{PKG_MODEL}/1") == (f"error: {PKG_MODEL} v1 cannot be approved: it is registered (it was "
                                         "registered with `relctl register`: no gate ran on it)")
    assert refused(f"{PKG_MODEL}/99") == f"error: {PKG_MODEL} v99 not found"
    assert refused(f"{PKG_MODEL}@production").startswith("error: signed-model@production: expected MODEL/VERSION")
    registry.set_version_tags(PKG_MODEL, "1", {T.RELEASE_STATE: "rejected"})
    assert refused(f"{PKG_MODEL}/1").startswith(f"error: {PKG_MODEL} v1 cannot be approved: it is rejected")
    # A version waiting for its approval whose package was rewritten with the registry's digests: the attack
    # is refused naming the file, and nothing is approved.
    registry.set_version_tags(PKG_MODEL, "1", {T.RELEASE_STATE: "awaiting-approval", T.GATED_AGAINST: ""})
    _attack(registry, "1")
    assert refused(f"{PKG_MODEL}/1") == (f"error: {PKG_MODEL} v1: model/genai_config.json differs from the "
                                         "signed package (signature by release.pub)")
    assert T.APPROVAL not in registry.get_version(PKG_MODEL, "1").tags
    assert "production" not in registry.aliases(PKG_MODEL)
    # Gated against no production, but production moved since: the comparison no longer holds.
    assert relctl(project_dir, "register", str(_package(tmp_path, 2)), "--model", PKG_MODEL,
                  "--production").exit_code == 0
    registry.set_version_tags(PKG_MODEL, "2", {T.RELEASE_STATE: "awaiting-approval", T.GATED_AGAINST: ""})
    registry.move_aliases(PKG_MODEL, {"production": None}, "test", "test", None)
    assert relctl(project_dir, "register", str(_package(tmp_path, 3)), "--model", PKG_MODEL,
                  "--production").exit_code == 0
    assert refused(f"{PKG_MODEL}/2") == (f"error: {PKG_MODEL} v2 cannot be approved: its gates compared it with no "
                                         "production version, but production is now v3")
    assert registry.aliases(PKG_MODEL)["production"] == "3"
    assert _artifact_root(registry, "2").is_dir()


def test_after_a_passed_canary_the_version_waits_and_approve_replaces_production(
        tmp_path_factory: pytest.TempPathFactory, tiny_run: Any, tinyllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary path: v2 is judged beside production v1 as `candidate`; once it passed, it keeps waiting
    there (production stays v1) until approved; the approval moves production and previous in one entry."""
    from dataclasses import replace

    from tests.stages.test_canary_release import CANARY

    for name in (UNSIGNED_ENV, USER_ENV):  # signed with the session's release key (tests/conftest.py)
        monkeypatch.delenv(name, raising=False)
    project = tmp_path_factory.mktemp("approval-canary")
    train = load_train_module()
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: fp32\n")
    first = relctl(project, "promote", train.log_run(tiny_run, project, experiment=MODEL))
    assert first.exit_code == 0, first.output
    second = tinyllm.train_tiny_llm(tmp_path_factory.mktemp("run2"), replace(tiny_run.config, seed=1))
    (project / "release.yaml").write_text(f"model: {MODEL}\nconvert:\n  precision: fp32\nrequire_approval: true\n"
                                          f"{CANARY}")
    promoted = relctl(project, "promote", train.log_run(second, project, experiment=MODEL), "--json")
    assert promoted.exit_code == 0, promoted.output
    report = json.loads(promoted.stdout)
    assert report["outcome"] == "awaiting-approval" and report["version"] == "2"
    assert next(g for g in report["gates"] if g["gate"] == "canary")["status"] == "pass"
    registry = Registry(resolve_store(project))
    assert registry.aliases(MODEL) == {"production": "1", "candidate": "2"}
    assert registry.get_version(MODEL, "2").tags[T.GATED_AGAINST] == "1"
    # A second canary of the waiting version could not move production on a pass: refused before serving.
    again = relctl(project, "canary", MODEL, "--version", "2")
    assert again.exit_code == 2, again.output
    assert again.stderr.splitlines()[0].startswith(f"error: {MODEL}: v2 cannot be canaried into production: ")
    assert "awaiting-approval" in again.stderr and f"relctl approve {MODEL}/2" in again.stderr
    assert registry.aliases(MODEL) == {"production": "1", "candidate": "2"}
    monkeypatch.setenv(USER_ENV, "carol")
    approved = relctl(project, "approve", f"{MODEL}/2", "--reason", "canary looked fine")
    assert approved.exit_code == 0, approved.output
    assert f"(signed with ${KEY_ENV})" in approved.stdout
    assert registry.aliases(MODEL) == {"production": "2", "previous": "1"}
    last = registry.history(MODEL)[-1]
    assert (last.action, last.user, last.changes) == ("approve", "carol", {
        "production": ["1", "2"], "previous": [None, "1"], "candidate": ["2", None]})
    assert registry.get_version(MODEL, "2").tags[T.APPROVAL_SIGNATURE] != ""
