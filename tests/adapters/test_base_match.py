"""Intake by content: an adapter goes onto a base only when the digest of the weights it trained on equals
the digest the base version recorded at its release; a mismatch is exit 2 in seconds, naming both digests
and both versions, before any download. Real MLflow (SQLite), runs logged by the example's train.py."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlflow
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.weights_digest import folder_base_digest
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import connect, ensure_experiment, resolve_store
from release.registry.transitions import promote as promote_version
from tests.conftest import load_train_module

BASE = "tiny-llm"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def base_version(project: Path, digest: str, merged: str | None = None) -> str:
    """A version of BASE as a release records it (tags only: the match reads nothing else), made production."""
    store = resolve_store(project)
    connect(store)
    registry = Registry(store)
    mlflow.set_experiment(experiment_id=ensure_experiment(store, "releases"))
    with mlflow.start_run() as run:
        pass
    registry.ensure_model(BASE, "test")
    tags = {T.RELEASE_RUN: run.info.run_id, T.BACKEND: "vllm", T.PRECISION: "fp32", T.BASE_SHA256: digest}
    if merged:
        tags[T.MERGED_ADAPTER_SHA256] = merged
    mv = registry.create_version(BASE, run.info.artifact_uri + "/package", run.info.run_id, tags, "base")
    promote_version(registry, BASE, str(mv.version), "test base", run.info.run_id)
    return str(mv.version)


def other_base(tiny_run: Any, tmp_path: Path) -> Any:
    """The example's run with one byte of its base weights changed: another base, same names everywhere."""
    folder = tmp_path / "other" / "checkpoint"
    shutil.copytree(tiny_run.checkpoint_dir, folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    return replace(tiny_run, checkpoint_dir=folder)


def test_the_example_records_the_digest_of_the_base_it_trained_on(tiny_run: Any, project_dir: Path) -> None:
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment=BASE)
    tags = Registry(resolve_store(project_dir)).get_run(run_id).tags
    assert tags[T.TRAINING_BASE_SHA256] == folder_base_digest(tiny_run.checkpoint_dir)
    # The base only: the adapter files beside it are not part of the base's identity.
    assert tags[T.TRAINING_BASE_SHA256].startswith("sha256:") and len(tags[T.TRAINING_BASE_SHA256]) == 71


def test_a_wrong_base_adapter_is_refused_by_digest_naming_both(tiny_run: Any, project_dir: Path,
                                                               tmp_path: Path) -> None:
    train = load_train_module()
    served = folder_base_digest(tiny_run.checkpoint_dir)
    wrong = other_base(tiny_run, tmp_path)
    trained_on = folder_base_digest(wrong.checkpoint_dir)
    v1 = base_version(project_dir, trained_on)   # the base the wrong run trained on, released once
    v2 = base_version(project_dir, served)       # production now
    run_id = train.log_run(wrong, project_dir, experiment="support-bot")
    started = time.monotonic()
    result = relctl(project_dir, "promote", run_id, "--onto", f"{BASE}@production")
    seconds = time.monotonic() - started
    print(f"wrong-base adapter refused in {seconds:.2f}s")
    assert result.exit_code == 2, result.output
    error = result.stderr.splitlines()[0]
    assert trained_on in error and served in error
    assert f"{BASE} v{v1}" in error and f"{BASE} v{v2}" in error
    assert not Registry(resolve_store(project_dir)).model_exists(f"{BASE}-support-bot")  # nothing registered


def test_what_cannot_be_proven_is_refused_before_any_download(tiny_run: Any, project_dir: Path) -> None:
    train = load_train_module()
    digest = folder_base_digest(tiny_run.checkpoint_dir)
    run_id = train.log_run(tiny_run, project_dir, experiment=BASE)
    # A spelling that names no base version.
    bad = relctl(project_dir, "promote", run_id, "--onto", BASE)
    assert bad.exit_code == 2 and "names no base version" in bad.stderr
    # A base released with an adapter merged into it serves other weights than the base the run trained on.
    base_version(project_dir, digest, merged="sha256:" + "ab" * 32)
    merged = relctl(project_dir, "promote", run_id, "--onto", f"{BASE}@production")
    assert merged.exit_code == 2 and "merged into it" in merged.stderr and digest in merged.stderr
    # A run that logged no base digest is matched by its checkpoint's (it holds the base weights), computed
    # at intake: another base is still refused, exit 2 naming both digests and the fix, nothing registered.
    mlflow.MlflowClient().delete_tag(run_id, T.TRAINING_BASE_SHA256)
    served = "sha256:" + "cd" * 32
    other = base_version(project_dir, served)
    untagged = relctl(project_dir, "promote", run_id, "--onto", f"{BASE}/{other}", "--json")
    assert untagged.exit_code == 2, untagged.output
    error, hint = untagged.stderr.splitlines()[-2:]
    assert digest in error and served in error and "by its checkpoint's base weights" in error, error
    assert hint.startswith("hint: ") and "relctl digest" in hint, hint
    assert json.loads(relctl(project_dir, "status", BASE, "--json").stdout)["aliases"]["production"]["version"] == other
    assert not Registry(resolve_store(project_dir)).model_exists(f"{BASE}-adapter")


def test_digest_prints_the_base_digest_a_run_logs(tiny_run: Any, project_dir: Path, tmp_path: Path) -> None:
    """`relctl digest DIR` is the digest promote compares (folder_base_digest: adapter files excluded), in
    text and --json; a folder that is not there or holds no weights is exit 2 with its fix."""
    digest = folder_base_digest(tiny_run.checkpoint_dir)
    text = relctl(project_dir, "digest", str(tiny_run.checkpoint_dir))
    assert text.exit_code == 0 and text.stdout.strip() == digest, text.output
    data = json.loads(relctl(project_dir, "digest", str(tiny_run.checkpoint_dir), "--json").stdout)
    assert data["base_sha256"] == digest and sorted(data["weights_sha256"]) == ["model.safetensors"]
    for folder in (tmp_path / "missing", tmp_path):
        bad = relctl(project_dir, "digest", str(folder))
        lines = bad.stderr.splitlines()
        assert bad.exit_code == 2 and len(lines) == 2, bad.output
        assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines


def production_version(project: Path, name: str, tags: dict[str, str], description: str) -> None:
    """A version of `name` registered from a fresh release run with `tags` (its run id added), made production."""
    store = resolve_store(project)
    connect(store)
    registry = Registry(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, "releases")) as run:
        pass
    registry.ensure_model(name, "test")
    tags = {T.RELEASE_RUN: run.info.run_id, **tags}
    mv = registry.create_version(name, run.info.artifact_uri + "/package", run.info.run_id, tags, description)
    promote_version(registry, name, str(mv.version), f"test {description}", run.info.run_id)


def adapter_version(project: Path, name: str, base_version_number: str, digest: str,
                    training_run: str | None = None) -> None:
    tags = {T.BACKEND: "vllm", T.KIND: "adapter", T.BASE_MODEL: BASE, T.BASE_VERSION: base_version_number,
            T.BASE_SHA256: digest}
    if training_run:
        tags[T.TRAINING_RUN] = training_run
    production_version(project, name, tags, "adapter")


def test_a_base_rollback_that_would_strand_adapters_is_refused(project_dir: Path) -> None:
    base_version(project_dir, "sha256:" + "11" * 32)
    v2 = base_version(project_dir, "sha256:" + "22" * 32)
    adapter_version(project_dir, f"{BASE}-support", v2, "sha256:" + "22" * 32)
    result = relctl(project_dir, "rollback", BASE)
    assert result.exit_code == 2, result.output
    assert f"{BASE}-support" in result.stderr and "--strand-adapters" in result.stderr
    assert Registry(resolve_store(project_dir)).aliases(BASE)["production"] == v2   # nothing moved


def test_trace_goes_from_an_adapters_answer_to_its_training_run(project_dir: Path, tmp_path: Path) -> None:
    store = resolve_store(project_dir)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, "support")) as training:
        pass
    digest = "sha256:" + "33" * 32
    base = base_version(project_dir, digest)
    adapter_version(project_dir, f"{BASE}-support", base, digest, training_run=training.info.run_id)
    headers = tmp_path / "headers.txt"
    headers.write_text(f"HTTP/1.1 200 OK\nx-relctl-model: {BASE}\nx-relctl-version: {base}\n"
                       f"x-relctl-serving-config: abc\nx-relctl-adapter: {BASE}-support\nx-relctl-adapter-version: 1\n")
    result = relctl(project_dir, "trace", str(headers), "--json")
    chain = json.loads(result.stdout)
    assert chain["model"] == f"{BASE}-support" and chain["version"] == "1"
    assert chain["training_run"]["id"] == training.info.run_id
    assert chain["adapter_of"] == {"model": BASE, "version": base, "base_sha256": digest}
    # These versions are tags only (no package): trace says the integrity check failed, exit 1.
    assert result.exit_code == 1 and chain["integrity"]["ok"] is False
