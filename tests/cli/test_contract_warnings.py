"""A checkpoint-only run, refused by `relctl check` and by `relctl promote`, as a newcomer reads the terminal:
each run-contract warning printed once, before the errors, and every line its own line (a hint never runs into
the next warning). Each command runs in its own process, stderr read as the terminal shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from release.registry.store import connect, ensure_experiment, resolve_store

REPO = Path(__file__).resolve().parents[2]
RELCTL = Path(sys.executable).parent / "relctl"
WARNINGS = ("has no mlflow.source.git.commit tag", "records no data digests",
            # gates.eval.separator (gates/eval_data.py): expected strings that already carry their separator
            "gates.eval: 2 of 3 expected strings in eval.jsonl start with whitespace")


def checkpoint_only_run(project: Path) -> str:
    """A run in a named experiment that logged a checkpoint and nothing else: no prompts, no git commit, no
    data digests."""
    store = resolve_store(project)
    connect(store)
    client = MlflowClient(tracking_uri=store.tracking_uri)
    run = client.create_run(ensure_experiment(store, "tiny-llm"))
    checkpoint = project / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    (checkpoint / "tokenizer.json").write_text("{}")
    client.log_artifacts(run.info.run_id, str(checkpoint), "checkpoint")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


@pytest.mark.parametrize("command", ["check", "promote"])
def test_contract_warnings_print_once_each_on_its_own_line(project_dir: Path, command: str) -> None:
    run_id = checkpoint_only_run(project_dir)
    # An eval set of model continuations (" b a"), scored with the gate's default separator: a warning that
    # names the count and the fix, from the eval gate's warnings hook on the run's data/eval.jsonl.
    rows = [{"prompt": "reverse a b ->", "expected": " b a"}, {"prompt": "reverse c d ->", "expected": " d c"},
            {"prompt": "reverse e f ->", "expected": "f e"}]
    (project_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    MlflowClient(tracking_uri=resolve_store(project_dir).tracking_uri).log_artifact(
        run_id, str(project_dir / "eval.jsonl"), "data")
    (project_dir / "release.yaml").write_text("gates:\n  eval:\n    metrics: [exact_match, token_accuracy]\n"
                                              "    thresholds: {exact_match: {threshold: 0.5}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([str(RELCTL), "--project-dir", str(project_dir), command, run_id], capture_output=True,
                          text=True, env=env, cwd=project_dir, timeout=300, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    for warning in WARNINGS:
        assert done.stderr.count(warning) == 1, done.stderr  # once: not again after the errors
    # check says `warning:`, promote's progress says `!`: either way a line of its own, never glued to a hint.
    starts = ("error: ", "hint: ", "warning: ", "! ")
    assert all(line.startswith(starts) for line in lines), done.stderr
    first_error = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert all(i < first_error for i, line in enumerate(lines) if any(w in line for w in WARNINGS)), done.stderr
    assert any("has no validation prompts" in line for line in lines if line.startswith("error: "))
    separator = next(line for line in lines if WARNINGS[2] in line)
    assert "prompt + separator ' ' + expected" in separator and "set gates.eval.separator: ''" in separator


# Runs `relctl ARGS...` in this interpreter the way the console script does, then reports sys.modules.
PROBE = """
import json, sys
from release.cli import cli
try:
    cli.main(args=sys.argv[1:], prog_name="relctl")
except SystemExit as exc:
    print("EXIT=" + str(exc.code))
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


def test_a_refused_promote_loads_nothing_a_release_needs(project_dir: Path) -> None:
    """Refused in seconds beyond opening the store (benchmarks/cli_latency.py): the pipeline, GitPython, rich and
    httpx (the vLLM backend's, loaded to ask whether it builds the family) are imported only by a release."""
    run_id = checkpoint_only_run(project_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", PROBE, "--project-dir", str(project_dir), "-q", "promote", run_id],
                          capture_output=True, text=True, env=env, cwd=project_dir, timeout=300, check=False)
    assert "EXIT=2" in done.stdout, done.stdout + done.stderr
    modules = set(json.loads(next(x for x in done.stdout.splitlines() if x.startswith("MODULES="))[8:]))
    assert "release.pipeline.contract" in modules and "release.backends.vllm.engine" in modules  # it did check
    top = {m.split(".")[0] for m in modules}
    assert not top & {"git", "rich", "httpx"}, sorted(top & {"git", "rich", "httpx"})
    assert not modules & {"release.pipeline.promote", "release.stages.convert", "release.stages.register"}
