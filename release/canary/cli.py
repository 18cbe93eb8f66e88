"""`relctl canary`: judge a candidate against production under the same live traffic.

Three ways to name the two sides (exactly one):
    relctl canary --production-url A --candidate-url B     two endpoints relctl did not start
    relctl canary --production PKG --candidate PKG          two package folders, each behind `relctl serve`
    relctl canary MODEL [--version V]                       the registry's production and candidate versions;
                                                            the aliases move at the outcome
    relctl canary ADAPTER [--version V] --server URL        an adapter's two versions on the one base server
                                                            that serves it (split by adapter name)
Exit 0 when the candidate passes, 1 when it fails, is inconclusive or is stopped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from release.commands.support import Ctx, emit, handled, json_option
from release.core.errors import Blocked, ConfigError, InputError

# The runner pulls in scipy (the judge), aiohttp and the router: only `relctl canary` itself pays for them,
# never `relctl --help` (tests/cli/test_startup.py).
if TYPE_CHECKING:
    from release.canary.runner import CanaryResult
    from release.canary.settings import CanaryConfig


def load_canary_config(path: Path | None, project_dir: Path) -> tuple[CanaryConfig, Path | None]:
    """The `gates.canary` block of `path` (default: the project's release.yaml, if any), else defaults."""
    from pydantic import ValidationError

    from release.canary.settings import CanaryConfig
    from release.config import gate_settings  # pydantic models + yaml: ~0.2 s every command would pay

    candidate = path or project_dir / "release.yaml"
    if not candidate.is_file():
        if path is not None:
            raise InputError(f"{path}: no such file", hint="pass -c path/to/release.yaml, or omit -c for defaults")
        return CanaryConfig(), None
    block = gate_settings(candidate, "canary")
    try:
        return CanaryConfig.model_validate(block), candidate.parent
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{candidate.name}: gates.canary.{where}: {first['msg']}",
                          hint="see docs/canary.md for the block's fields") from exc


def apply_options(config: CanaryConfig, steps: str | None, step_requests: int | None, rate: float | None,
                  dataset: Path | None, shadow: bool, confidence: float | None) -> CanaryConfig:
    """Command-line options over the release.yaml block (validated the same way)."""
    from pydantic import ValidationError

    from release.canary.settings import CanaryConfig

    data: dict[str, Any] = config.model_dump()
    if steps is not None:
        try:
            data["steps"] = [float(s) for s in steps.split(",") if s.strip()]
        except ValueError as exc:
            raise InputError(f"--steps {steps}: not a list of numbers", hint="e.g. --steps 10,25,50") from exc
    for key, value in (("step_requests", step_requests), ("confidence", confidence)):
        if value is not None:
            data[key] = value
    if shadow:
        data["shadow"] = True
    if rate is not None:
        data["traffic"]["rate"] = rate
    if dataset is not None:
        data["traffic"]["dataset"] = str(dataset.resolve())
    try:
        return CanaryConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"canary option {'.'.join(str(p) for p in first['loc'])}: {first['msg']}",
                         hint="see relctl canary --help") from exc


@click.command("canary")
@click.argument("model", required=False)
@click.option("--production-url", help="Production's OpenAI-compatible endpoint (not started by relctl).")
@click.option("--candidate-url", help="The candidate's OpenAI-compatible endpoint (not started by relctl).")
@click.option("--production", "production_pkg", type=click.Path(path_type=Path), help="Production's package folder.")
@click.option("--candidate", "candidate_pkg", type=click.Path(path_type=Path), help="The candidate's package folder.")
@click.option("--version", "candidate_version", help="MODEL mode: put this version under canary (sets `candidate`).")
@click.option("--server", "server_url", metavar="URL",
              help="MODEL is an adapter: the running `relctl serve BASE --adapters` both versions are served on "
                   "(its admin key in RELCTL_ADMIN_KEY; its completions key, if any, in RELCTL_API_KEY).")
@click.option("-c", "--config", "config_path", type=click.Path(path_type=Path),
              help="release.yaml with a gates.canary block (default: the project's, else built-in defaults).")
@click.option("--steps", help="Candidate share per step in percent, comma-separated, e.g. 10,25,50.")
@click.option("--step-requests", type=int, help="Requests each check waits for.")
@click.option("--rate", type=float, help="Requests per second through the router.")
@click.option("--dataset", type=click.Path(path_type=Path), help="JSONL of prompts (with `expected`: quality).")
@click.option("--shadow", is_flag=True, help="Mirror production's requests instead of splitting them.")
@click.option("--confidence", type=float, help="Confidence of the shift intervals (default 0.98).")
@click.option("--out", type=click.Path(path_type=Path), help="Evidence folder (default .relctl/canary/<time>).")
@json_option
@click.pass_obj
@handled
def canary_command(ctx: Ctx, model: str | None, production_url: str | None, candidate_url: str | None,
                   production_pkg: Path | None, candidate_pkg: Path | None, candidate_version: str | None,
                   server_url: str | None, config_path: Path | None, steps: str | None,
                   step_requests: int | None, rate: float | None, dataset: Path | None, shadow: bool,
                   confidence: float | None, out: Path | None, as_json: bool) -> None:
    """Judge a candidate against production under the same live traffic; exit 1 unless it passes."""
    from release.canary.runner import run_canary
    from release.canary.servers import served
    from release.serving.loadgen.bench import check_url

    ctx.as_json = as_json
    config, base_dir = load_canary_config(config_path, ctx.project_dir)
    config = apply_options(config, steps, step_requests, rate, dataset, shadow, confidence)
    work = out or ctx.project_dir / ".relctl" / "canary" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    say = (lambda line: None) if (ctx.quiet or as_json) else (lambda line: click.echo(line, err=True))
    if server_url is not None and model is None:
        raise InputError("canary: --server names the base server of an adapter MODEL",
                         hint="relctl canary ADAPTER --server http://127.0.0.1:8000")
    modes = [production_url is not None or candidate_url is not None,
             production_pkg is not None or candidate_pkg is not None, model is not None]
    if sum(modes) != 1:
        raise InputError("canary: name the two sides one way: URLs, package folders, or a MODEL",
                         hint="e.g. relctl canary --production-url http://127.0.0.1:8000 --candidate-url http://127.0.0.1:8001")
    extra: dict[str, Any] = {}
    if model is not None:
        from release.canary.registry_mode import run_model_canary

        result, extra = run_model_canary(model, candidate_version, config, work, base_dir, ctx.project_dir, say,
                                         server_url)
    elif modes[0]:
        if production_url is None or candidate_url is None:
            raise InputError("canary: --production-url and --candidate-url go together", hint="pass both")
        check_url(production_url)
        check_url(candidate_url)
        result = run_canary(production_url, candidate_url, config, work, base_dir, progress=say)
    else:
        if production_pkg is None or candidate_pkg is None:
            raise InputError("canary: --production and --candidate go together", hint="pass both package folders")
        with served(production_pkg, candidate_pkg, work, config) as (prod, cand):
            result = run_canary(prod.url, cand.url, config, work, base_dir, progress=say)
            extra = {"servers": {"production": prod.info, "candidate": cand.info}}
    report = finish_report(result, work, extra)
    emit(report, as_json, lambda: _print(result, report))
    if not result.passed:
        raise Blocked(f"canary {result.outcome}: {result.reason}",
                      hint=f"per-metric tests and latency CDFs are in {work}")


def finish_report(result: CanaryResult, work: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """The gate-shaped report (evidence written under `work`) as JSON-ready data."""
    from release.canary.result import gate_result

    gate = gate_result("canary", result, work, extra)
    return {"status": gate.status, "reason": gate.reason, "metrics": gate.metrics,
            "evidence": [str(p) for p in gate.evidence], **gate.details}


def _print(result: CanaryResult, report: dict[str, Any]) -> None:
    mark = "✓" if result.passed else "✗"
    click.echo(f"{mark} canary {result.outcome}: {result.reason}")
    for check in result.checks:
        click.echo(f"  {check.label:<16} {check.weight:>5g}%  {check.judgement.verdict:<12} "
                   f"score {check.judgement.score:.2f}  ({check.candidate_requests} candidate / "
                   f"{check.production_requests} production requests)")
    if result.rollback_s is not None and not result.passed:
        click.echo(f"  candidate at 0% {result.rollback_s * 1000:.2f} ms after the failed check; "
                   f"{result.candidate_after_rollback} requests to it afterwards")
    click.echo(f"  evidence: {Path(report['evidence'][0]).parent}")


