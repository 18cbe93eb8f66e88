"""lm-evaluation-harness tasks through `relctl serve`: lm-eval's `local-completions` model, each document's
metric values as SampleScores (ids: lm-eval's doc ids).

Tokenization matches the server exactly: lm-eval tokenizes with the package's own tokenizer files (the ones
the server loads) with special tokens on, as the served model encodes text (its BOS included), and sends token
ids (`tokenized_requests`), which the server scores as given. Log-likelihood tasks send `echo` with `logprobs`,
so the backend must declare prompt log-probabilities (release.backends.base.LogprobSupport).

A task YAML's relative `dataset_kwargs.data_files` mean files beside the YAML (rewritten to absolute paths
before lm-eval sees them), so a team's task folder can move as a whole.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gates.base import Problem
from gates.harness.config import HarnessTask, harness_version, resolve_path
from gates.harness.results import TaskRun, scores_by_metric
from gates.samples import SampleScores

# lm-eval metrics whose per-document value is 0 or 1 (compared by an exact McNemar test); other numeric
# ones are continuous, and corpus-level ones (f1, bleu, mcc: per-document items, no score) are left out.
BINARY_METRICS = frozenset({"acc", "acc_norm", "exact_match", "acc_mutual_info"})
TARGET_METRIC = "target_loglikelihood"


@dataclass(frozen=True)
class LmEvalTask:
    """A resolved lm-eval task: its name, the YAML it came from, the config lm-eval gets, and digests of the
    YAML and its local data files (what the package records)."""

    name: str
    yaml_path: Path | None
    config: dict[str, Any] | None   # None: lm-eval loads it by name (a group, or a task without a YAML)
    digests: dict[str, str]


def task_problems(task: HarnessTask, key: str, config_dir: Path | None) -> list[Problem]:
    return resolve_task(task, key, config_dir)[1]


def resolve_task(task: HarnessTask, key: str, config_dir: Path | None) -> tuple[LmEvalTask | None, list[Problem]]:
    """The task an entry names, or the problems that stop it (all of them)."""
    if task.file is not None:
        path = resolve_path(task.file, config_dir)
        if not path.is_file():
            return None, [Problem(f"{key}: task YAML '{task.file}' not found (looked in {path.parent})",
                                  "fix `file`; relative paths are relative to release.yaml's folder")]
        return _from_yaml(path, None, key)
    assert task.task is not None
    include = resolve_path(task.include_path, config_dir) if task.include_path is not None else None
    if include is not None and not include.is_dir():
        return None, [Problem(f"{key}: include_path '{task.include_path}' is not a folder (looked for {include})",
                              "fix include_path; relative paths are relative to release.yaml's folder")]
    from lm_eval.tasks import TaskManager  # noqa: PLC0415 - the harness loads only where a task is checked or run

    # With an include path only that folder is indexed (seconds); lm-eval's own ~15k task YAMLs otherwise.
    manager = TaskManager(include_path=str(include) if include else None, include_defaults=include is None)
    entry = manager.task_index.get(task.task)
    if entry is None:
        close = difflib.get_close_matches(task.task, manager.all_tasks, n=3)
        where = f"in {task.include_path}" if include else "among lm-eval's tasks"
        return None, [Problem(f"{key}: task '{task.task}' does not resolve {where}",
                              f"did you mean {', '.join(close)}?" if close else
                              "name a task defined by a YAML in include_path (its `task:` key), or use `file`")]
    if entry.yaml_path is None or entry.kind.name != "TASK":
        return LmEvalTask(task.task, None, None, {}), []
    return _from_yaml(Path(entry.yaml_path), task.task, key)


def _from_yaml(path: Path, name: str | None, key: str) -> tuple[LmEvalTask | None, list[Problem]]:
    from lm_eval.tasks._yaml_loader import load_yaml  # noqa: PLC0415

    try:
        # Functions (`!function`) stay unresolved here: checking a task runs none of its code.
        config = load_yaml(path, resolve_func=False)
    except Exception as exc:  # YAML syntax, a missing include: the file is the user's to fix
        return None, [Problem(f"{key}: task YAML {path} cannot be read: {exc}", "fix the task YAML")]
    task_name = name or config.get("task")
    if not isinstance(task_name, str):
        return None, [Problem(f"{key}: {path} has no `task:` name", "give the task YAML a `task: NAME` key")]
    files, problems = _data_files(config, path.parent, f"{key}: {path.name}")
    if problems:
        return None, problems
    digests = {str(path): _sha256(path), **{str(f): _sha256(f) for f in files}}
    return LmEvalTask(task_name, path, _with_absolute_data(config, path.parent), digests), []


def _data_files(config: dict[str, Any], base: Path, key: str) -> tuple[list[Path], list[Problem]]:
    """The local data files a task config names, and a problem for each one that is missing."""
    kwargs = config.get("dataset_kwargs") or {}
    named = _listed(kwargs.get("data_files")) if isinstance(kwargs, dict) else []
    dataset_path = config.get("dataset_path")
    if not named and isinstance(dataset_path, str) and dataset_path.startswith((".", "/", "~")):
        named = [dataset_path]  # a local dataset folder or file instead of a hub name
    found: list[Path] = []
    problems: list[Problem] = []
    for name in named:
        path = resolve_path(Path(name), base)
        matches = sorted(path.parent.glob(path.name)) if any(c in name for c in "*?[") else [path]
        if not matches or not all(p.exists() for p in matches):
            problems.append(Problem(f"{key}: data file '{name}' not found (looked in {path.parent})",
                                    "fix dataset_kwargs.data_files; relative paths are relative to the task YAML's "
                                    "folder"))
        found += [p for p in matches if p.is_file()]
    return found, problems


def _listed(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _listed(item)]
    return []


def _with_absolute_data(config: dict[str, Any], base: Path) -> dict[str, Any]:
    kwargs = config.get("dataset_kwargs")
    if not isinstance(kwargs, dict) or "data_files" not in kwargs:
        return config
    files = kwargs["data_files"]

    def absolute(value: Any) -> Any:
        if isinstance(value, str):
            return str(resolve_path(Path(value), base))
        if isinstance(value, list):
            return [absolute(v) for v in value]
        if isinstance(value, dict):
            return {k: absolute(v) for k, v in value.items()}
        return value

    return {**config, "dataset_kwargs": {**kwargs, "data_files": absolute(files)}}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_task(task: HarnessTask, resolved: LmEvalTask, base_url: str, model: str, tokenizer_dir: Path,
             max_length: int) -> TaskRun:
    """Run one resolved task against the server at `base_url` (serving `model`); per-document scores."""
    import lm_eval  # noqa: PLC0415
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    spec: str | dict[str, Any] = resolved.name
    if resolved.config is not None and resolved.yaml_path is not None:
        from lm_eval.tasks._yaml_loader import load_yaml  # noqa: PLC0415

        spec = _with_absolute_data(load_yaml(resolved.yaml_path, resolve_func=True), resolved.yaml_path.parent)
        spec["task"] = resolved.name
    include = resolved.yaml_path.parent if resolved.yaml_path is not None else None
    manager = TaskManager(include_path=str(include) if include else None, include_defaults=include is None)
    model_args = {"base_url": f"{base_url}/v1/completions", "model": model, "tokenizer": str(tokenizer_dir),
                  "tokenizer_backend": "huggingface", "tokenized_requests": True, "add_bos_token": True,
                  "max_length": max_length, "num_concurrent": 1, "max_retries": 1}
    results = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=[spec],
                                      task_manager=manager, log_samples=True, limit=task.limit)
    if results is None:
        raise RuntimeError(f"lm-eval returned no results for {resolved.name}")
    scores: list[SampleScores] = []
    skipped: list[str] = []
    responses: dict[str, dict[str, Any]] = {}
    for name, samples in sorted(results.get("samples", {}).items()):
        better = results.get("higher_is_better", {}).get(name, {})
        found, left_out = scores_by_metric(f"lm_eval/{name}", _per_metric(samples), better, BINARY_METRICS)
        scores += found
        skipped += left_out
        responses[name] = _responses(samples)
    config = json.loads(json.dumps(results.get("configs", {}), default=str))
    recorded_args = {k: v for k, v in model_args.items() if k != "base_url"}
    return TaskRun(harness="lm-eval", harness_version=harness_version("lm-eval") or "", task=resolved.name,
                   tasks=sorted(results.get("samples", {})), digests=resolved.digests,
                   config={"task": config, "versions": json.loads(json.dumps(results.get("versions", {}),
                                                                           default=str)),
                           "model_args": recorded_args, "limit": task.limit},
                   scores=tuple(scores), skipped_metrics=tuple(skipped), responses=responses)


def _per_metric(samples: list[dict[str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """metric (qualified by its filter where lm-eval ran several) -> [(doc id, value)] from logged samples,
    and for a multiple-choice task `target_loglikelihood`: the correct choice's log-likelihood, a continuous
    score that moves before accuracy does."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for sample in samples:
        suffix = "" if sample.get("filter", "none") == "none" else f",{sample['filter']}"
        for metric in sample.get("metrics", []):
            out.setdefault(f"{metric}{suffix}", []).append((str(sample["doc_id"]), sample.get(metric)))
        target = _target_loglikelihood(sample)
        if target is not None and not suffix:
            out.setdefault(TARGET_METRIC, []).append((str(sample["doc_id"]), target))
    return out


def _target_loglikelihood(sample: dict[str, Any]) -> float | None:
    target, responses = sample.get("target"), sample.get("filtered_resps")
    if not isinstance(target, int) or isinstance(target, bool) or not isinstance(responses, list) \
            or not 0 <= target < len(responses):
        return None
    chosen = responses[target]
    value = chosen[0] if isinstance(chosen, (list, tuple)) and chosen else None
    return float(value) if isinstance(value, float) else None


def _responses(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """doc id -> what the model answered (log-likelihoods per choice, or generated text), unfiltered runs only."""
    return {str(s["doc_id"]): json.loads(json.dumps(s.get("filtered_resps"), default=str))
            for s in samples if s.get("filter", "none") == "none"}
