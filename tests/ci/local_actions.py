"""Run a GitHub Actions job's own `run:` steps locally, the way a runner does.

Each step's script runs with `bash --noprofile --norc -eo pipefail FILE` (what `shell: bash` means on a
runner), with the workflow, job and step `env:` merged and their `${{ }}` expressions resolved from the
given contexts, and with its own GITHUB_STEP_SUMMARY, GITHUB_OUTPUT and GITHUB_ENV files. Steps that
`uses:` an action are not run (reported as skipped); after a failure only `if: always()` steps run.

The expression evaluator covers what env values in relctl's workflows use: context paths
(`inputs.run_id`), string literals, true/false, and `||` (first truthy operand). Anything else raises,
so a workflow change that needs more cannot pass silently.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
PATH_TOKEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")


@dataclass
class StepOutcome:
    name: str
    status: str  # success | failure | skipped
    exit_code: int | None = None
    log: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    reason: str = ""


@dataclass
class JobRun:
    steps: list[StepOutcome]
    summary: str  # every step's GITHUB_STEP_SUMMARY, in order, as the job summary page shows them

    def step(self, name: str) -> StepOutcome:
        return next(s for s in self.steps if s.name == name)

    @property
    def failed(self) -> bool:
        return any(s.status == "failure" for s in self.steps)


def evaluate(expr: str, contexts: dict[str, Any]) -> Any:
    """One `${{ }}` expression; see the module docstring for what is supported."""
    for operand in (part.strip() for part in expr.split("||")):
        value = _operand(operand, contexts)
        if value not in (None, "", False, 0):
            return value
    return value


def _operand(token: str, contexts: dict[str, Any]) -> Any:
    if token in ("true", "false"):
        return token == "true"
    if len(token) >= 2 and token[0] == token[-1] == "'":
        return token[1:-1].replace("''", "'")
    if not PATH_TOKEN.match(token) or token.split(".")[0] not in contexts:
        raise ValueError(f"unsupported expression operand {token!r}")
    value: Any = contexts
    for part in token.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def render(text: str, contexts: dict[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        value = evaluate(match.group(1), contexts)
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    return EXPRESSION.sub(one, str(text))


def run_job(workflow: Path, job_id: str, workspace: Path, contexts: dict[str, Any],
            skip: dict[str, str] | None = None, base_env: dict[str, str] | None = None,
            timeout_s: float = 600) -> JobRun:
    """Run job `job_id` of `workflow` in `workspace`; `skip` maps step names to the reason they are not run."""
    wf = yaml.safe_load(workflow.read_text())
    job = wf["jobs"][job_id]
    shell = (wf.get("defaults", {}).get("run", {}) or {}).get("shell", "bash")
    if shell != "bash":
        raise ValueError(f"only shell: bash is supported, not {shell}")
    runner_temp = workspace / ".runner-temp"
    runner_temp.mkdir(parents=True, exist_ok=True)
    env_ctx: dict[str, str] = {}
    ctx = {**contexts, "env": env_ctx}
    for scope in (wf.get("env", {}), job.get("env", {})):
        env_ctx.update({k: render(v, ctx) for k, v in scope.items()})
    github = contexts["github"]
    base = {**(base_env if base_env is not None else dict(os.environ)), "CI": "true", "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(workspace), "GITHUB_REPOSITORY": github["repository"],
            "GITHUB_SHA": github["sha"], "GITHUB_RUN_ID": str(github["run_id"]), "RUNNER_TEMP": str(runner_temp)}
    added_env: dict[str, str] = {}
    outcomes: list[StepOutcome] = []
    summaries: list[str] = []
    for index, step in enumerate(job["steps"]):
        name = step.get("name") or step.get("uses") or f"step {index}"
        failed = any(s.status == "failure" for s in outcomes)
        condition = str(step.get("if", "success()")).strip()
        if condition not in ("success()", "always()"):
            raise ValueError(f"{name}: unsupported if: {condition}")
        if failed and condition != "always()":
            outcomes.append(StepOutcome(name, "skipped", reason="an earlier step failed"))
            continue
        if "uses" in step:
            outcomes.append(StepOutcome(name, "skipped", reason=f"action {step['uses']} is not run locally"))
            continue
        if skip and name in skip:
            outcomes.append(StepOutcome(name, "skipped", reason=skip[name]))
            continue
        step_env = {k: render(v, ctx) for k, v in step.get("env", {}).items()}
        files = {key: runner_temp / f"{index}-{key.lower()}" for key in
                 ("GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT", "GITHUB_ENV")}
        for path in files.values():
            path.write_text("")
        script = runner_temp / f"{index}.sh"
        script.write_text(step["run"])
        env = {**base, **env_ctx, **added_env, **step_env, **{k: str(v) for k, v in files.items()}}
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                              cwd=workspace, env=env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        summaries.append(files["GITHUB_STEP_SUMMARY"].read_text())
        added_env.update(_key_values(files["GITHUB_ENV"].read_text()))
        outcomes.append(StepOutcome(name, "success" if done.returncode == 0 else "failure", done.returncode,
                                    done.stdout + done.stderr, _key_values(files["GITHUB_OUTPUT"].read_text())))
    return JobRun(outcomes, "".join(summaries))


def _key_values(text: str) -> dict[str, str]:
    """`key=value` lines (the heredoc form `key<<EOF` is not used by relctl's workflows, so it is refused)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if "<<" in line.split("=", 1)[0]:
            raise ValueError("multi-line GITHUB_OUTPUT/GITHUB_ENV values are not supported here")
        key, _, value = line.partition("=")
        values[key] = value
    return values
