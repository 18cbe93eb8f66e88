"""Inspect AI tasks through `relctl serve`: the task file's @task run against the server's OpenAI-compatible
chat API (Inspect's `openai-api` provider), each sample's scores as SampleScores (ids: the dataset's sample
ids, with the epoch when there are several).

The preflight reads the task file without running it: its @task functions (Python's ast) and the data files
its dataset calls name as string literals (json_dataset("qa.jsonl"), relative to the task file's folder).
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

from gates.base import Problem
from gates.harness.config import HarnessTask, harness_version, resolve_path
from gates.harness.results import TaskRun, scores_by_metric
from gates.samples import SampleScores

DATASET_READERS = frozenset({"json_dataset", "csv_dataset", "file_dataset"})
# Inspect scorers whose values are CORRECT/INCORRECT (1/0 through value_to_float).
BINARY_SCORERS = frozenset({"match", "includes", "exact", "choice", "pattern", "answer", "model_graded_qa",
                            "model_graded_fact"})


def task_problems(task: HarnessTask, key: str, config_dir: Path | None) -> list[Problem]:
    assert task.file is not None
    path = resolve_path(task.file, config_dir)
    if not path.is_file():
        return [Problem(f"{key}: task file '{task.file}' not found (looked in {path.parent})",
                        "fix `file`; relative paths are relative to release.yaml's folder")]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        return [Problem(f"{key}: {path.name} is not a readable Python file: {exc}", "fix the task file")]
    tasks = _task_functions(tree)
    problems: list[Problem] = []
    if task.task is not None and task.task not in tasks:
        problems.append(Problem(f"{key}: {path.name} defines no @task named '{task.task}'",
                                f"its tasks: {', '.join(tasks) or 'none'}"))
    elif task.task is None and len(tasks) != 1:
        problems.append(Problem(f"{key}: {path.name} defines {len(tasks)} @task functions; name one in `task`",
                                f"its tasks: {', '.join(tasks) or 'none (decorate one with @task)'}"))
    for name in _dataset_files(tree):
        data = resolve_path(Path(name), path.parent)
        if not data.exists():
            problems.append(Problem(f"{key}: {path.name}: data file '{name}' not found (looked in {data.parent})",
                                    "fix the dataset path in the task file; relative paths are relative to its "
                                    "folder"))
    return problems


def _task_functions(tree: ast.Module) -> list[str]:
    def is_task(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return (isinstance(target, ast.Name) and target.id == "task") or \
            (isinstance(target, ast.Attribute) and target.attr == "task")

    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(is_task(d) for d in node.decorator_list)]


def _dataset_files(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in DATASET_READERS:
                names.append(node.args[0].value)
    return names


def run_task(task: HarnessTask, base_url: str, model: str, log_dir: Path, config_dir: Path | None) -> TaskRun:
    """Run the entry's Inspect task against the server at `base_url` (serving `model`); per-sample scores."""
    from inspect_ai import eval as inspect_eval  # noqa: PLC0415 - the harness loads only where a task runs
    from inspect_ai.model import get_model  # noqa: PLC0415
    from inspect_ai.scorer import value_to_float  # noqa: PLC0415

    assert task.file is not None
    path = resolve_path(task.file, config_dir)
    spec = f"{path}@{task.task}" if task.task else str(path)
    served = get_model(f"openai-api/relctl/{model}", base_url=f"{base_url}/v1", api_key="unused")
    # Greedy, as lm-eval asks: candidate and production answer each sample deterministically, so a paired
    # difference is the models', not the sampler's.
    logs = inspect_eval(spec, model=served, limit=task.limit, log_dir=str(log_dir), display="none",
                        log_samples=True, score=True, temperature=0.0)
    log = logs[0]
    if log.status != "success" or log.samples is None:
        error = log.error.message if log.error else log.status
        raise RuntimeError(f"Inspect task {task.label} did not finish: {error}")
    to_float = value_to_float()
    epochs = len({s.epoch for s in log.samples}) > 1
    values: dict[str, list[tuple[str, Any]]] = {}
    for sample in log.samples:
        sid = f"{sample.id}#{sample.epoch}" if epochs else str(sample.id)
        for scorer, score in (sample.scores or {}).items():
            value = score.value
            values.setdefault(scorer, []).append((sid, to_float(value) if not isinstance(value, dict) else None))
    name = log.eval.task
    scores: list[SampleScores]
    scores, skipped = scores_by_metric(f"inspect/{name}", values, {}, BINARY_SCORERS)
    files = [path, *(resolve_path(Path(n), path.parent) for n in _dataset_files(ast.parse(path.read_text())))]
    digests = {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}
    config = {"task": name, "task_args": log.eval.task_args, "dataset": log.eval.dataset.model_dump(mode="json"),
              "solver": [s.model_dump(mode="json") for s in (log.plan.steps if log.plan else [])],
              "limit": task.limit, "model": f"openai-api/relctl/{model}", "temperature": 0.0}
    return TaskRun(harness="inspect", harness_version=harness_version("inspect") or "", task=task.label,
                   tasks=[name], digests=digests, config=config, scores=tuple(scores), skipped_metrics=tuple(skipped))
