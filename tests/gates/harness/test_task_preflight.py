"""`relctl check` refuses eval tasks that cannot run, before any stage and all at once (exit 2): a task name
that does not resolve, a task YAML whose data file is missing, a harness that is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gates.harness.config import HarnessTask, task_problems
from tests.conftest import REPO_ROOT, load_train_module

MC_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: 0
metric_list:
  - metric: acc
"""
INSPECT_TASK = '''from inspect_ai import Task, task
from inspect_ai.dataset import json_dataset
from inspect_ai.scorer import match


@task
def qa() -> Task:
    return Task(dataset=json_dataset("qa.jsonl"), scorer=match())
'''


def write_tasks(project: Path) -> None:
    tasks = project / "tasks"
    tasks.mkdir()
    (tasks / "reverse.jsonl").write_text('{"prompt": "reverse a b ->", "choices": ["b a", "a b"]}\n')
    (tasks / "reverse_mc.yaml").write_text(MC_YAML.format(name="reverse_mc", data="reverse.jsonl"))
    team = project / "team"
    team.mkdir()
    (team / "broken.yaml").write_text(MC_YAML.format(name="broken_mc", data="data/missing.jsonl"))
    evals = project / "evals"
    evals.mkdir()
    (evals / "qa.py").write_text(INSPECT_TASK)
    (evals / "qa.jsonl").write_text('{"input": "2+2?", "target": "4"}\n')


RELEASE_YAML = """gates:
  eval:
    thresholds: {exact_match: {threshold: 0.5}}
    tasks:
      - {harness: lm-eval, task: reverse_mcq, include_path: tasks}
      - {harness: lm-eval, file: team/broken.yaml}
      - {harness: inspect, file: evals/qa.py}
      - {harness: lm-eval, task: reverse_mc, include_path: tasks}
"""


def test_check_names_every_task_problem_before_any_stage(project_dir: Path, tiny_run: Any, tmp_path: Path) -> None:
    write_tasks(project_dir)
    (project_dir / "release.yaml").write_text(RELEASE_YAML)
    run_id = load_train_module().log_run(tiny_run, project_dir)
    # Inspect is "not installed" for this process: its module fails to import, as on a machine without it.
    shadow = tmp_path / "shadow" / "inspect_ai"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named inspect_ai')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(REPO_ROOT)])}
    done = subprocess.run([sys.executable, "-c", "from release.cli import main; main()", "--project-dir",
                           str(project_dir), "check", run_id], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, done.stderr
    assert any("task 'reverse_mcq' does not resolve in tasks" in e for e in errors)
    assert any("broken.yaml: data file 'data/missing.jsonl' not found" in e for e in errors)
    assert any("inspect-ai is not installed" in e for e in errors)
    assert "did you mean reverse_mc?" in done.stderr and "relctl[harness]" in done.stderr
    assert not (project_dir / ".relctl" / "work").exists()


def test_a_resolving_task_set_has_no_problems(tmp_path: Path) -> None:
    write_tasks(tmp_path)
    tasks = [HarnessTask(harness="lm-eval", task="reverse_mc", include_path=Path("tasks")),
             HarnessTask(harness="inspect", file=Path("evals/qa.py"), task="qa")]
    assert task_problems(tasks, tmp_path) == []
    (tmp_path / "evals" / "qa.jsonl").unlink()
    (problem,) = task_problems(tasks, tmp_path)
    assert "qa.py: data file 'qa.jsonl' not found" in problem.message


@pytest.mark.parametrize("entry", [{"harness": "lm-eval"}, {"harness": "lm-eval", "task": "a", "file": "b.yaml"},
                                   {"harness": "inspect", "task": "qa"},
                                   {"harness": "inspect", "file": "qa.py", "include_path": "tasks"}])
def test_an_entry_names_exactly_one_task(entry: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"names|include_path"):
        HarnessTask.model_validate(entry)
