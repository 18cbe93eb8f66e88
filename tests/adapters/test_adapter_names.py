"""`relctl check RUN --onto BASE@alias` runs promote --onto's pre-flight, and the names rule: an adapter
release never writes into a whole model's registered name, a merged release never into an adapter's
(release/registry/kinds.py, one rule for check and promote). Cheap: tags-only versions as
tests/adapters/test_base_match.py makes them, no engine starts; every refusal is exit 2 with one error and
one hint line, before any slow stage, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.weights_digest import folder_base_digest
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from tests.adapters.test_base_match import BASE, adapter_version, base_version, other_base, production_version
from tests.conftest import load_train_module

SUPPORT = f"{BASE}-support"
OTHER = "other-llm"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def whole_model(project: Path, name: str) -> None:
    """A whole model's version under `name` (tags as a merged release records them), made production."""
    production_version(project, name, {T.BACKEND: "vllm", T.PRECISION: "fp32", T.BASE_SHA256: "sha256:" + "ef" * 32},
                       "whole model")


def snapshot(project: Path, *names: str) -> dict[str, Any]:
    registry = Registry(resolve_store(project))
    return {n: (sorted(registry.version_tags(n)), registry.aliases(n)) for n in names if registry.model_exists(n)}


def one_error(result: Result, expected: str) -> None:
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, result.output
    found = [i for i, line in enumerate(lines) if line.startswith("error: ") and expected in line]
    assert len(found) == 1, lines
    assert lines[found[0] + 1].startswith("hint: "), lines


def test_check_onto_runs_the_adapter_pre_flight(tiny_run: Any, project_dir: Path, tmp_path: Path) -> None:
    """check --onto is promote --onto's pre-flight: the base proven by digest, the adapter's name (--model, else
    BASE-EXPERIMENT), what an adapter release cannot carry out; a run without the digest tag checks with a
    warning that promote computes it at intake."""
    train = load_train_module()
    served = folder_base_digest(tiny_run.checkpoint_dir)
    v1 = base_version(project_dir, served)
    run_id = train.log_run(tiny_run, project_dir, experiment="support")
    checked = relctl(project_dir, "check", run_id, "--onto", f"{BASE}@production", "--json")
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["found"]["base"] is True and report["model"] == SUPPORT and report["needs"] is None
    named = json.loads(relctl(project_dir, "check", run_id, "--onto", f"{BASE}/{v1}", "--model", "my-lora",
                              "--json").stdout)
    assert named["ok"] is True and named["model"] == "my-lora"
    text = relctl(project_dir, "check", run_id, "--onto", f"{BASE}@production")
    assert text.exit_code == 0 and f"the adapter goes onto its base as {SUPPORT}" in text.stdout, text.output
    # A run trained on other weights: refused naming both digests, as promote --onto refuses it.
    wrong = other_base(tiny_run, tmp_path)
    wrong_run = train.log_run(wrong, project_dir, experiment="support")
    refused = relctl(project_dir, "check", wrong_run, "--onto", f"{BASE}@production")
    one_error(refused, folder_base_digest(wrong.checkpoint_dir))
    assert served in refused.stderr
    # The same refusals as promote --onto for what an adapter release does not carry out, and for bad input.
    (project_dir / "release.yaml").write_text(f"model: {BASE}\ngates:\n  safety: {{}}\n")
    one_error(relctl(project_dir, "check", run_id, "--onto", f"{BASE}@production"),
              "gates.safety: not run by an adapter release")
    (project_dir / "release.yaml").unlink()
    one_error(relctl(project_dir, "check", run_id, "--onto", BASE), "names no base version")
    one_error(relctl(project_dir, "check", run_id, "--onto", f"{BASE}@production", "--model", BASE),
              "an adapter is its own registered model")
    # No digest tag: checked all the same, with the word that promote computes it from the checkpoint.
    mlflow.MlflowClient().delete_tag(run_id, T.TRAINING_BASE_SHA256)
    untagged = relctl(project_dir, "check", run_id, "--onto", f"{BASE}@production", "--json")
    assert untagged.exit_code == 0, untagged.output
    assert any("computes it from the checkpoint" in w for w in json.loads(untagged.stdout)["warnings"])


def test_an_adapter_release_never_writes_into_a_whole_models_name(tiny_run: Any, project_dir: Path) -> None:
    base_version(project_dir, folder_base_digest(tiny_run.checkpoint_dir))
    whole_model(project_dir, OTHER)
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment="support")
    before = snapshot(project_dir, BASE, OTHER)
    for command in ("promote", "check"):
        result = relctl(project_dir, command, run_id, "--onto", f"{BASE}@production", "--model", OTHER)
        one_error(result, f"{OTHER} is a whole model's registered name (v1): an adapter release never writes")
        assert "intake" not in result.stderr  # before the download
    (project_dir / "release.yaml").write_text(f"model: {OTHER}\nrelease:\n  mode: adapter\n  onto: {BASE}@production\n")
    one_error(relctl(project_dir, "promote", run_id), f"{OTHER} is a whole model's registered name")
    assert snapshot(project_dir, BASE, OTHER) == before  # nothing written


def test_a_merged_release_never_writes_into_an_adapters_name(tiny_run: Any, project_dir: Path) -> None:
    digest = folder_base_digest(tiny_run.checkpoint_dir)
    base = base_version(project_dir, digest)
    adapter_version(project_dir, SUPPORT, base, digest)
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment=BASE)
    before = snapshot(project_dir, BASE, SUPPORT)
    for command in ("promote", "check"):
        result = relctl(project_dir, command, run_id, "--model", SUPPORT)
        one_error(result, f"{SUPPORT} is an adapter's registered name (v1): a merged release never writes")
        assert "intake" not in result.stderr
    (project_dir / "release.yaml").write_text(f"model: {SUPPORT}\n")
    one_error(relctl(project_dir, "promote", run_id), f"{SUPPORT} is an adapter's registered name")
    assert snapshot(project_dir, BASE, SUPPORT) == before
