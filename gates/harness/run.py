"""Serve each package once with `relctl serve` on 127.0.0.1 and run every `gates.eval.tasks` entry through
it: the candidate, then production, on the same tasks, so their samples pair by id."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gates.harness import inspect, lm_eval
from gates.harness.config import HarnessTask, task_problems
from gates.harness.results import TaskRun, task_scores
from gates.samples import SampleScores
from release.core.errors import InputError, ReleaseError
from release.core.package import read_manifest
from release.serving.process import ServerProcess

SAMPLES_FILE = "harness-samples.jsonl"


@dataclass(frozen=True)
class HarnessResults:
    """Every task's run on the candidate and (when there is one) on production."""

    candidate: list[TaskRun]
    production: list[TaskRun] | None
    samples_file: Path                 # every sample's value per metric and side (the gate's evidence)
    production_note: str | None = None

    def scores(self, side: str) -> list[SampleScores]:
        runs = self.candidate if side == "candidate" else self.production or []
        return [s for run in runs for s in run.scores]

    def task_scores(self) -> list[dict[str, Any]]:
        """Each task's metrics, candidate beside production (gates/harness/results.py: task_scores)."""
        return task_scores(self.candidate, self.production)

    def record(self) -> dict[str, Any]:
        """What the gate's details keep: per task, the harness, its version, task names, digests, config."""
        return {"candidate": [r.record() for r in self.candidate],
                "production": None if self.production is None else [r.record() for r in self.production],
                "production_note": self.production_note}


def run_tasks(tasks: list[HarnessTask], candidate: Path, production: Path | None, work: Path,
              config_dir: Path | None) -> HarnessResults:
    """Run `tasks` through the served candidate and production (InputError: everything that stops them)."""
    problems = task_problems(tasks, config_dir)
    if problems:
        raise InputError("; ".join(p.message for p in problems), hint=problems[0].hint)
    resolved = [lm_eval.resolve_task(t, t.label, config_dir)[0] if t.harness == "lm-eval" else None for t in tasks]
    work.mkdir(parents=True, exist_ok=True)
    runs = _serve_and_run(tasks, resolved, candidate, work / "candidate", config_dir)
    prod_runs, note = None, None
    if production is not None:
        try:
            prod_runs = _serve_and_run(tasks, resolved, production, work / "production", config_dir)
        except ReleaseError as exc:  # production that cannot be served is noted, never a verdict on the candidate
            note = f"production was not scored on the harness tasks: {exc.message}"
    results = HarnessResults(runs, prod_runs, work / SAMPLES_FILE, note)
    _write_samples(results.samples_file, results)
    return results


def _serve_and_run(tasks: list[HarnessTask], resolved: list[lm_eval.LmEvalTask | None], package: Path,
                   work: Path, config_dir: Path | None) -> list[TaskRun]:
    tokenizer_dir = read_manifest(package).model_dir
    with ServerProcess(str(package), work / "server", project_dir=work) as server:
        card = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]
        model, context = str(card["id"]), int(card["max_model_len"])
        runs: list[TaskRun] = []
        for task, found in zip(tasks, resolved, strict=True):
            if found is not None:
                runs.append(lm_eval.run_task(task, found, server.url, model, tokenizer_dir, context))
            else:
                runs.append(inspect.run_task(task, server.url, model, work / "inspect-logs", config_dir))
        return runs


def _write_samples(path: Path, results: HarnessResults) -> None:
    """Every sample's value per metric and side (the evidence the paired comparison is computed from), then
    each sample's raw answer (lm-eval: every choice's log-likelihood)."""
    lines = []
    for side in ("candidate", "production"):
        for scores in results.scores(side):
            for sid, value in zip(scores.ids, scores.values, strict=True):
                lines.append(json.dumps({"side": side, "metric": scores.metric, "kind": scores.kind, "id": sid,
                                         "value": value}))
    for side, runs in (("candidate", results.candidate), ("production", results.production or [])):
        for run in runs:
            for task, answers in run.responses.items():
                lines += [json.dumps({"side": side, "task": task, "id": sid, "response": answer})
                          for sid, answer in answers.items()]
    path.write_text("".join(line + "\n" for line in lines))
