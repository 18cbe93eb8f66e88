"""The release story against `mlflow server` on PostgreSQL + SeaweedFS S3, and promotes at the same time.

- promote run 1, promote run 2, rollback, history and status through release.commands.api (fp32, no gates:
  the pipeline is the subject elsewhere; here it is the registry at scale);
- 4 `relctl promote` processes at once, 2 models x 2 runs: the aliases and the history of both models
  must tell one consistent, non-interleaved story;
- 4 processes moving one model's aliases 6 times each, as fast as they can: the lock has to hold;
- no credential (S3 secret, database password, tracking token or password) and no part of the release
  signing key (RELCTL_SIGNING_KEY, a PEM, as CI passes it) appears in anything relctl printed, logged,
  tagged or stored as an artifact; every release is signed with it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from safetensors import safe_open
from safetensors.numpy import save_file

from release.commands import api
from release.registry import Registry
from release.registry.aliases import AliasMove
from release.registry.store import resolve_store
from tests.scale.conftest import ScaleRegistry
from tests.stages.test_promote import load_train_module

pytestmark = pytest.mark.slow
RELCTL = [sys.executable, "-c", "from release.cli import main; main()"]
RELEASE_YAML = "model: {model}\nconvert:\n  precision: fp32\n"


def perturbed(tiny_run: Any, dest: Path) -> Any:
    """The session's trained run with its LoRA B matrices scaled by 0.9: a second, different candidate.

    Training a second run costs ~35 s of CPU; this gives a distinct package (new checksums) for free.
    """
    checkpoint = dest / "checkpoint"
    shutil.copytree(tiny_run.checkpoint_dir, checkpoint)
    adapter = checkpoint / "adapter_model.safetensors"
    with safe_open(str(adapter), framework="np") as fh:
        tensors = {k: fh.get_tensor(k) * (0.9 if "lora_B" in k else 1.0) for k in fh.keys()}
        metadata = fh.metadata()
    save_file({k: v.astype(v.dtype) for k, v in tensors.items()}, str(adapter), metadata=metadata)
    return replace(tiny_run, checkpoint_dir=checkpoint)


def relctl_env(registry: ScaleRegistry, auth: str = "token") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_", "RELCTL_"))}
    return {**env, **registry.client_env(auth)}


def check_history(name: str, aliases: dict[str, str], moves: list[AliasMove]) -> None:
    """Replaying `moves` in order from no aliases must end exactly at `aliases`: every move started
    from the state the one before it left (a move that read stale aliases breaks the chain)."""
    state: dict[str, str] = {}
    for i, move in enumerate(moves):
        assert move.state in ("done", "repaired"), f"{name}: move {i} is {move.state}: {move}"
        for alias, (before, after) in move.changes.items():
            assert state.get(alias) == before, (
                f"{name}: move {i} ({move.action} at {move.at}) says {alias} was {before}, but the moves "
                f"before it left {state.get(alias)}: interleaved alias moves\n" + "\n".join(map(str, moves)))
            if after is None:
                state.pop(alias, None)
            else:
                state[alias] = after
    assert state == aliases, f"{name}: history replays to {state}, the registry says {aliases}"
    stamps = [m.at for m in moves]
    assert stamps == sorted(stamps), f"{name}: history out of time order: {stamps}"


@pytest.fixture(scope="module")
def runs(scale_registry: ScaleRegistry, tiny_run: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two training runs of the example logged through the server (username/password credentials)."""
    train = load_train_module()
    project = tmp_path_factory.mktemp("scale-story")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in scale_registry.client_env("password").items():
            mp.setenv(key, value)
        run1 = train.log_run(tiny_run, project, experiment="scale-tiny-llm")
        run2 = train.log_run(perturbed(tiny_run, tmp_path_factory.mktemp("run2")), project,
                             experiment="scale-tiny-llm")
    return {"project": project, "runs": (run1, run2), "env": dict(scale_registry.client_env("password"))}


@pytest.fixture(scope="module")
def story(runs: dict[str, Any], scale_registry: ScaleRegistry) -> dict[str, Any]:
    """promote 1, promote 2, rollback, history, status: all through release.commands.api against the server."""
    project, (run1, run2) = runs["project"], runs["runs"]
    model = f"scale-story-{secrets.token_hex(3)}"
    (project / "release.yaml").write_text(RELEASE_YAML.format(model=model))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in runs["env"].items():
            mp.setenv(key, value)
        first = api.promote(run1, project)
        second = api.promote(run2, project)
        back = api.rollback(model, project, "scale story: back to the first release")
        moves = api.history(model, project)
        status = api.status(model, project)
        aliases = Registry(resolve_store(project)).aliases(model)
    return {"model": model, "project": project, "reports": (first, second), "rollback": back,
            "history": moves, "status": status, "aliases": aliases}


def test_story_promote_promote_rollback_history(story: dict[str, Any], runs: dict[str, Any],
                                                scale_registry: ScaleRegistry) -> None:
    first, second = story["reports"]
    assert (first.outcome, first.version, first.aliases) == ("released", "1", {"production": [None, "1"]})
    assert (second.outcome, second.version) == ("released", "2")
    assert second.aliases == {"production": ["1", "2"], "previous": [None, "1"]}
    assert story["rollback"].changes["production"] == ["2", "1"]
    assert story["aliases"] == {"production": "1"}
    assert [(m.action, m.changes["production"]) for m in story["history"]] == [
        ("promote", [None, "1"]), ("promote", ["1", "2"]), ("rollback", ["2", "1"])]
    check_history(story["model"], story["aliases"], story["history"])
    assert story["status"]["aliases"]["production"]["training_run"] == runs["runs"][0]
    # The package really is in the object store behind the server, not in the project folder.
    client = MlflowClient(tracking_uri=scale_registry.tracking_uri)
    mv = client.get_model_version(story["model"], "2")
    run = client.get_run(mv.run_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    key = scale_registry.artifact_key(run.info.artifact_uri)
    listed = scale_registry.s3().list_objects_v2(Bucket="relctl-scale", Prefix=key)
    assert any(o["Key"].endswith("relctl-package.json") for o in listed.get("Contents", []))
    assert not (story["project"] / ".relctl" / "mlflow.db").exists()


@pytest.fixture(scope="module")
def concurrent(runs: dict[str, Any], story: dict[str, Any], scale_registry: ScaleRegistry,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """4 `relctl promote` processes started together: models A and B, each with runs 1 and 2.

    After the story (whatever the test order), so its finished stages seed every process's project.
    """
    project = runs["project"]
    tag = secrets.token_hex(3)
    models = (f"scale-a-{tag}", f"scale-b-{tag}")
    procs = []
    for model in models:
        config = tmp_path_factory.mktemp("cfg") / "release.yaml"
        config.write_text(RELEASE_YAML.format(model=model))
        for run in runs["runs"]:
            # Each process works in its own project copy (stage folders are per project), seeded with
            # the story's finished stages, so the processes spend their time registering, at once.
            own = tmp_path_factory.mktemp("concurrent")
            shutil.copytree(project / ".relctl" / "work", own / ".relctl" / "work")
            procs.append((model, run, own, subprocess.Popen(
                [*RELCTL, "--project-dir", str(own), "promote", run, "--config", str(config)],
                env=relctl_env(scale_registry, "userinfo"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = []
    for model, run, own, proc in procs:
        out, err = proc.communicate(timeout=300)
        results.append({"model": model, "run": run, "project": own, "code": proc.returncode, "out": out,
                        "err": err})
    client = Registry(resolve_store(project, {"MLFLOW_TRACKING_URI": scale_registry.tracking_uri}))
    return {"models": models, "results": results, "registry": client}


CONFLICT = "while the gates ran"


def test_four_concurrent_promotes_leave_consistent_aliases_and_history(concurrent: dict[str, Any]) -> None:
    """Per model, the two promotes were serialized: both released, the second replacing the first; or
    the later one found production moved under its gates and refused the move (exit 4, its version
    registered but not promoted). Never both moving from the same production."""
    registry: Registry = concurrent["registry"]
    for model in concurrent["models"]:
        mine = [r for r in concurrent["results"] if r["model"] == model]
        codes = sorted(r["code"] for r in mine)
        assert codes in ([0, 0], [0, 4]), "\n".join(f"exit {r['code']}\n{r['out']}\n{r['err']}" for r in mine)
        aliases = registry.aliases(model)
        moves = registry.history(model)
        check_history(model, aliases, moves)
        versions = sorted(str(v.version) for v in registry.client.search_model_versions(f"name='{model}'"))
        assert versions == ["1", "2"], f"{model}: versions {versions}"
        assert all(m.action == "promote" for m in moves)
        if codes == [0, 0]:
            assert len(moves) == 2
            assert aliases == {"production": moves[1].changes["production"][1],
                               "previous": moves[0].changes["production"][1]}
            assert aliases["production"] != aliases["previous"]
        else:
            refused = next(r for r in mine if r["code"] == 4)
            error = [line for line in refused["err"].splitlines() if line.startswith("error: ")]
            assert len(error) == 1 and CONFLICT in error[0], refused["err"]
            assert len(moves) == 1 and aliases == {"production": moves[0].changes["production"][1]}
    assert not any(m.startswith("relctl.lock.") for m in registry.list_models()), "a lease was left behind"


MOVER = """
import sys, time
from pathlib import Path
from release.registry import Registry
from release.registry.store import connect, resolve_store
model, procs, n, me = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = resolve_store(Path("."))
connect(store)
registry = Registry(store)
registry.aliases(model)
# A barrier: every process has imported relctl and connected before any of them moves an alias.
Path(f"ready-{me}").touch()
deadline = time.monotonic() + 180
while len(list(Path(".").glob("ready-*"))) < procs and time.monotonic() < deadline:
    time.sleep(0.01)
def toggle(current):
    # Decided under the lock from the aliases read under it: every move changes production.
    return {"production": "2" if current.get("production") == "1" else "1", "previous": current.get("production")}
for i in range(n):
    registry.locked_move(model, toggle, "rollback", f"{me} #{i}", None)
"""


def test_alias_moves_of_one_model_from_four_processes_never_interleave(
        scale_registry: ScaleRegistry, tmp_path: Path) -> None:
    """24 moves of one model from 4 processes at once, each decided from the aliases read under the lease.

    Without the lease the same processes interleave (a move records a 'from' that another move has
    already replaced), which check_history reports.
    """
    env = relctl_env(scale_registry)
    registry = Registry(resolve_store(tmp_path, {"MLFLOW_TRACKING_URI": scale_registry.tracking_uri}))
    model = f"scale-race-{secrets.token_hex(3)}"
    registry.ensure_model(model, "lock test")
    source = registry.client.create_run(registry.client.create_experiment(model)).info.run_id
    for _ in range(2):
        registry.create_version(model, f"runs:/{source}/package", source, {}, "lock test version")
    registry.move_aliases(model, {"production": "1"}, "promote", "start", None)
    procs = [subprocess.Popen([sys.executable, "-c", MOVER, model, "4", "6", f"p{i}"], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    for proc in procs:
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    moves = registry.history(model)
    assert len(moves) == 1 + 4 * 6
    check_history(model, registry.aliases(model), moves)


def _texts(root: Path) -> Iterator[tuple[str, str]]:
    for path in root.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            yield str(path), path.read_bytes().decode("utf-8", "replace")


def test_no_credential_is_printed_logged_tagged_or_stored(
        story: dict[str, Any], concurrent: dict[str, Any], runs: dict[str, Any],
        scale_registry: ScaleRegistry, tmp_path: Path) -> None:
    secret_values = scale_registry.secret_values
    assert len(secret_values) == 6 and all(len(s) > 16 for s in secret_values)
    seen: list[tuple[str, str]] = []
    for r in concurrent["results"]:
        seen += [(f"stdout of promote {r['model']} {r['run']}", r["out"]),
                 (f"stderr of promote {r['model']} {r['run']}", r["err"])]
        seen += list(_texts(r["project"]))              # .relctl/logs, work folders, reports
    seen += list(_texts(story["project"]))
    client = MlflowClient(tracking_uri=scale_registry.tracking_uri)
    for rm in client.search_registered_models():
        seen.append((f"model {rm.name}", f"{rm.description} {rm.tags}"))
        for mv in client.search_model_versions(f"name='{rm.name}'"):
            full = client.get_model_version(rm.name, mv.version)
            seen.append((f"version {rm.name} v{mv.version}", f"{full.description} {full.tags} {full.source}"))
    runs_seen = 0
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=200):
            runs_seen += 1
            seen.append((f"run {run.info.run_id}", f"{run.data.tags} {run.data.params} {run.info.run_name}"))
            dest = tmp_path / run.info.run_id
            dest.mkdir()
            client.download_artifacts(run.info.run_id, "", str(dest))
            seen += list(_texts(dest))
    assert runs_seen >= 2 + 2 + 4  # the training runs, the story's releases and the concurrent ones
    assert sum(1 for name, _ in seen if "report" in name) > 0, "no release report was downloaded"
    # The key was used (each release signed with it), so its absence below means something.
    assert any(name.endswith("relctl-package.sig") for name, _ in seen), "no release was signed"
    leaks = [(where, secret[:6] + "...") for where, text in seen for secret in secret_values if secret in text]
    assert not leaks, f"credentials found in: {leaks}"
