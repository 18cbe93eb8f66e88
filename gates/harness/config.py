"""`gates.eval.tasks`: the standard eval tasks the eval gate runs through the served candidate and production,
and their preflight, so `relctl check` refuses a task that cannot run before any stage, every problem at once.

```yaml
gates:
  eval:
    tasks:
      - {harness: lm-eval, task: reverse_mc, include_path: tasks/}   # a task name, looked up in a folder of YAMLs
      - {harness: lm-eval, file: tasks/qa.yaml}                       # a team's task YAML
      - {harness: inspect, file: evals/qa.py, task: qa}               # an Inspect task file (and its @task)
```
Relative paths (file, include_path, a task YAML's `dataset_kwargs.data_files`) mean files beside the file that
names them: release.yaml's folder, or the task YAML's.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gates.base import Problem

HarnessName = Literal["lm-eval", "inspect"]
# harness -> (its import name, its distribution on PyPI)
HARNESSES: dict[str, tuple[str, str]] = {"lm-eval": ("lm_eval", "lm-eval"), "inspect": ("inspect_ai", "inspect-ai")}
INSTALL_HINT = "install relctl's harness extra: pip install 'relctl[harness]' (make install does)"


class HarnessTask(BaseModel):
    """One entry of `gates.eval.tasks`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: HarnessName = Field(description="lm-eval (lm-evaluation-harness) or inspect (Inspect AI)")
    task: str | None = Field(default=None, description="lm-eval: a task name (in include_path, else lm-eval's "
                                                       "own tasks); inspect: the @task in `file`")
    file: Path | None = Field(default=None, description="lm-eval: a task YAML; inspect: a task file (.py)")
    include_path: Path | None = Field(default=None, description="lm-eval: the folder of task YAMLs `task` is "
                                                                "looked up in")
    limit: int | None = Field(default=None, ge=1, description="at most this many samples (default: all)")

    @model_validator(mode="after")
    def _names_a_task(self) -> HarnessTask:
        if self.harness == "lm-eval" and (self.task is None) == (self.file is None):
            raise ValueError("an lm-eval entry names exactly one of `task` (with include_path) or `file`")
        if self.harness == "inspect" and self.file is None:
            raise ValueError("an inspect entry names its task file in `file`")
        if self.include_path is not None and (self.harness != "lm-eval" or self.task is None):
            raise ValueError("include_path goes with an lm-eval `task` name")
        return self

    @property
    def label(self) -> str:
        """How reports name the entry: its task name, or its file's stem."""
        return self.task or (self.file.stem if self.file else self.harness)


def harness_version(harness: str) -> str | None:
    """The installed version of a harness, or None when it is not installed: its module does not import."""
    module, distribution = HARNESSES[harness]
    try:
        importlib.import_module(module)
        return version(distribution)
    except (ImportError, PackageNotFoundError):
        return None


def resolve_path(path: Path, base: Path | None) -> Path:
    """`path` as given when absolute, else relative to `base` (the folder of the file that names it)."""
    path = path.expanduser()
    return path if path.is_absolute() or base is None else base / path


def task_problems(tasks: list[HarnessTask], config_dir: Path | None) -> list[Problem]:
    """Everything that would stop a task before it runs, for all tasks at once: a harness that is not
    installed, a task that does not resolve, a task file or data file that is missing."""
    from gates.harness import inspect, lm_eval  # noqa: PLC0415 - each imports its harness only when it runs

    problems: list[Problem] = []
    for i, task in enumerate(tasks):
        key = f"release.yaml: gates.eval.tasks[{i}] ({task.harness} {task.label})"
        if harness_version(task.harness) is None:
            problems.append(Problem(f"{key}: {HARNESSES[task.harness][1]} is not installed", INSTALL_HINT))
            continue
        check = lm_eval.task_problems if task.harness == "lm-eval" else inspect.task_problems
        problems += check(task, key, config_dir)
    return problems
