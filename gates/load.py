"""The load gate: the candidate package behind a real `relctl serve` on 127.0.0.1, open-loop traffic,
SLOs on latency percentiles, error rate and goodput, and the cost per million output tokens at the
rate where the SLOs still hold.

With a production version, the same seeded plan is replayed against it right after (compare_production):
its figures are reported and plotted beside the candidate's, labelled by version, and never judged.

Cost per million output tokens = GPU price per hour x GPUs / (output tokens/s x 3600) x 1e6.
With a serverless price, the break-even utilization is the share of that capacity a dedicated
deployment must keep busy to be cheaper than paying per token (or per request).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gates.base import GateContext, GateResult, Problem, ThresholdCheck, missing_file
from release.core.errors import InputError, ReleaseError
from release.core.faults import pause_point
from release.core.server_settings import ServerSettings
from release.serving.loadgen.bench import run_bench
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.runner import MIN_STEP_REQUESTS, Traffic, planned_sweep_s, step_seconds
from release.serving.loadgen.summary import SLOs
from release.serving.process import ServerProcess


class CostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_price_per_hour: float | None = Field(default=None, ge=0,
                                             description="price of one accelerator (or host) per hour")
    gpus: int = Field(default=1, ge=1, description="accelerators per replica")
    max_cost_per_million_tokens: float | None = Field(default=None, gt=0, description="fail above this cost")
    serverless_price_per_million_tokens: float | None = Field(default=None, gt=0)
    serverless_price_per_request: float | None = Field(default=None, gt=0)


class LoadConfig(BaseModel):
    """`gates.load` in release.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    traffic: Traffic = Traffic(rate=2.0, requests=40)
    slos: SLOs = SLOs()
    endpoint: Literal["completions", "chat"] = "completions"
    max_concurrency: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    sweep: bool = Field(default=False, description="find the highest SLO-meeting rate, starting at traffic.rate")
    sweep_rates: list[Annotated[float, Field(gt=0)]] | None = Field(
        default=None, description="with sweep: these rates (requests/s, each > 0) instead of the doubling search")
    step_duration_s: float = Field(default=5.0, gt=0)
    max_duration_s: float = Field(
        default=900.0, gt=0, description="with sweep: the cap on its total sending time; given sweep_rates must fit "
        "it (checked by relctl check), a doubling search stops before a step that would end past it")
    repeat_best: bool = Field(default=False, description="with sweep: send the best step's plan once more; the "
                              "spread is the repeat noise an engines table needs to call a ranking or a tie")
    server: ServerSettings | None = Field(default=None, description="server settings; default: the package's own")
    cost: CostConfig = CostConfig()
    compare_production: bool = Field(
        default=True, description="also replay the same plan against production (reported and plotted, not judged)")

    @model_validator(mode="after")
    def _sweep_fits_its_cap(self) -> LoadConfig:
        # Refused in relctl check, before any build: a step waits for at least 20 requests, so a low rate runs
        # for hours whatever step_duration_s says.
        if self.sweep and self.sweep_rates:
            planned = planned_sweep_s(self.sweep_rates, self.step_duration_s)
            if planned > self.max_duration_s:
                slowest = min(self.sweep_rates)
                raise ValueError(
                    f"the sweep sends for {planned:.0f}s, over max_duration_s {self.max_duration_s:g}s (a step sends "
                    f"at least {MIN_STEP_REQUESTS} requests: at rate {slowest:g} that alone is "
                    f"{step_seconds(slowest, self.step_duration_s):.0f}s); raise the low sweep_rates or "
                    "max_duration_s")
        return self


class LoadGate:
    """Starts the candidate, warms it, runs the configured traffic and judges SLOs and cost."""

    id: ClassVar[str] = "load"
    Config: ClassVar[type[BaseModel]] = LoadConfig

    def __init__(self, config: LoadConfig) -> None:
        self.config = config

    def bounds(self) -> list[str]:
        """What relctl check states about how long this gate may take."""
        cfg = self.config
        if not cfg.sweep:
            return []
        planned = (f"; its sweep_rates send for {planned_sweep_s(cfg.sweep_rates, cfg.step_duration_s):.0f}s"
                   if cfg.sweep_rates else "")
        return [f"gates.load: the sweep sends for at most {cfg.max_duration_s:g}s (gates.load.max_duration_s){planned}"]

    def preflight(self, config_dir: Path | None) -> list[Problem]:
        traffic = self.config.traffic
        named = [("gates.load.traffic.dataset", traffic.dataset), ("gates.load.traffic.trace", traffic.trace)]
        return [p for key, value in named if value for p in [missing_file(key, value, config_dir)] if p]

    def run(self, context: GateContext) -> GateResult:
        cfg = self.config
        work = context.work_dir
        work.mkdir(parents=True, exist_ok=True)
        server_config = _write_server_config(work, cfg.server)
        candidate = f"v{context.version} candidate" if context.version else "candidate"
        packages = {candidate: context.package_dir}
        # The same seeded plan against production, one server after the other, so the plot and the report
        # put both side by side on this machine now (a sweep finds one endpoint's limit: candidate only).
        if context.production is not None and cfg.compare_production and not cfg.sweep:
            packages[f"v{context.production.version} production"] = context.production.package_dir
        try:
            with contextlib.ExitStack() as stack:
                servers = {candidate: stack.enter_context(ServerProcess(
                    str(context.package_dir), work / "server", config=server_config, project_dir=work))}
                note = self._start_production(stack, packages, servers, work, server_config)
                pause_point("gate:load:serving")
                client = ClientOptions(base_url=servers[candidate].url, model=None, endpoint=cfg.endpoint,
                                       max_concurrency=cfg.max_concurrency, timeout_s=cfg.timeout_s)
                report = run_bench([s.url for s in servers.values()], cfg.traffic, cfg.slos, client, work,
                                   do_sweep=cfg.sweep, sweep_rates=cfg.sweep_rates,
                                   step_duration_s=cfg.step_duration_s, base_dir=context.config_dir,
                                   labels=list(servers), repeat_best=cfg.repeat_best and cfg.sweep,
                                   max_duration_s=cfg.max_duration_s)
                report["server"] = servers[candidate].info
                if note:
                    report["production_note"] = note
        except InputError:
            raise  # the user's to fix (exit 2), not a verdict on the model
        except ReleaseError as exc:
            return GateResult(self.id, "fail", f"load test could not run: {exc.message}",
                              evidence=sorted(work.glob("server*/server.log")))
        return judge(self.id, cfg, report, work)

    @staticmethod
    def _start_production(stack: contextlib.ExitStack[Any], packages: dict[str, Path],
                          servers: dict[str, ServerProcess], work: Path, server_config: Path | None) -> str | None:
        """Production's server beside the candidate's; one that cannot start is noted, never a verdict."""
        for label, package in list(packages.items())[1:]:
            try:
                servers[label] = stack.enter_context(ServerProcess(str(package), work / "server-production",
                                                                   config=server_config, project_dir=work))
            except ReleaseError as exc:
                return f"production was not measured beside the candidate: {exc.message}"
        return None


def judge(gate_id: str, cfg: LoadConfig, report: dict[str, Any], work: Path) -> GateResult:
    """Turn a bench report into the gate's result: SLO checks at the judged rate, then cost."""
    if report["kind"] == "sweep":
        judged = report["best"] or report["runs"][0]
    else:
        judged = report["runs"][0]
    summary = judged["summary"]
    checks = [ThresholdCheck(c["metric"], c["value"], c["op"], c["bound"], c["passed"]) for c in judged["slo_checks"]]
    slo_met = judged["passed"]
    cost = cost_figures(cfg.cost, summary) if slo_met else {}
    ceiling = cfg.cost.max_cost_per_million_tokens
    if ceiling is not None:
        value = cost.get("cost_per_million_tokens")
        checks.append(ThresholdCheck("cost_per_million_tokens", value, "<=", ceiling,
                                     value is not None and value <= ceiling))
    metrics = _metrics(summary, cost)
    failed = [c for c in checks if not c.passed]
    if failed:
        reason = "missed: " + "; ".join(f"{c.metric} {_fmt(c.value)} (needs {c.op} {c.bound:g})" for c in failed)
    else:
        reason = (f"SLOs met at {_fmt(summary['target_rate'])} req/s: p99 TTFT {_fmt(summary['ttft_ms']['p99'])} ms, "
                  f"p99 TPOT {_fmt(summary['tpot_ms']['p99'])} ms, {summary['output_token_throughput']:.1f} tok/s")
    evidence = [Path(run["records"]) for run in report["runs"]] + [Path(p) for p in report["plots"]]
    evidence.append(work / "summary.json")
    details: dict[str, Any] = {"rate": summary["target_rate"], "kind": report["kind"], "cost": cost,
                               "server": report.get("server", {}), "sweep_best_rate": report.get("best_rate")}
    if report["kind"] == "sweep":
        details["limit"] = sweep_limit(report)
        details["sweep_steps"] = [{"rate": r["rate"], "passed": r["passed"]} for r in report["runs"]]
        if report.get("repeat"):
            repeat = report["repeat"]["summary"]
            details["repeat"] = {"rate": report["repeat"]["rate"],
                                 "output_token_throughput": [summary["output_token_throughput"],
                                                             repeat["output_token_throughput"]]}
    if report.get("production_note"):
        details["production_note"] = report["production_note"]
    if report["kind"] == "compare":  # production on the same plan: shown beside the candidate, never judged
        production = report["runs"][1]
        details["production_label"] = production["label"]
        details["production_metrics"] = _metrics(production["summary"], cost_figures(cfg.cost, production["summary"]))
    return GateResult(gate_id, "fail" if failed else "pass", reason, metrics=metrics, thresholds=checks,
                      evidence=evidence, details=details)


def sweep_limit(report: dict[str, Any]) -> dict[str, Any]:
    """What stopped the sweep: the first failing step above the best rate (its failed checks and its errors
    by kind: an http_429 is the server's queue refusing), or {"rate": None} when no step failed."""
    best = report.get("best_rate")
    above = [r for r in report["runs"]
             if not r["passed"] and r["rate"] is not None and (best is None or r["rate"] > best)]
    if not above:
        return {"rate": None, "failed": [], "errors": {}}
    step = min(above, key=lambda r: float(r["rate"]))
    summary = step["summary"]
    return {"rate": step["rate"], "failed": [c["metric"] for c in step["slo_checks"] if not c["passed"]],
            "errors": summary.get("errors", {}), "requests": summary.get("requests"),
            "checks": {c["metric"]: [c["value"], c["op"], c["bound"]] for c in step["slo_checks"] if not c["passed"]},
            "e2el_mean_ms": (summary.get("e2el_ms") or {}).get("mean")}


def cost_figures(cost: CostConfig, summary: dict[str, Any]) -> dict[str, float]:
    """Cost per million output tokens at the measured throughput, and serverless break-even points."""
    tokens_per_s = float(summary["output_token_throughput"])
    if cost.gpu_price_per_hour is None or tokens_per_s <= 0:
        return {}
    per_hour = cost.gpu_price_per_hour * cost.gpus
    out = {"cost_per_million_tokens": per_hour / (tokens_per_s * 3600) * 1e6, "cost_per_hour": per_hour}
    if cost.serverless_price_per_million_tokens is not None:
        # Dedicated at utilization u costs cost_per_million / u per million tokens; equal at u = cost / price.
        serverless = cost.serverless_price_per_million_tokens
        out["breakeven_utilization_vs_per_token"] = out["cost_per_million_tokens"] / serverless
    requests_per_s = float(summary["request_throughput"])
    if cost.serverless_price_per_request is not None and requests_per_s > 0:
        per_request = cost.serverless_price_per_request
        out["breakeven_utilization_vs_per_request"] = per_hour / (requests_per_s * 3600 * per_request)
    return out


def _metrics(summary: dict[str, Any], cost: dict[str, float]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat, value in summary[name].items():
            if value is not None:
                metrics[f"{name.removesuffix('_ms')}_{stat}_ms"] = float(value)
    for name in ("error_rate", "request_throughput", "output_token_throughput", "goodput_rps", "achieved_rate"):
        if summary.get(name) is not None:
            metrics[name] = float(summary[name])
    metrics["client_lag_p99_ms"] = float(summary["client_lag_ms"]["p99"])
    return {**metrics, **cost}


def _write_server_config(work: Path, server: ServerSettings | None) -> Path | None:
    if server is None:
        return None
    path = work / "server-config.yaml"
    path.write_text(yaml.safe_dump({"serving": {"server": server.model_dump()}}))
    return path


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


__all__ = ["CostConfig", "LoadConfig", "LoadGate", "cost_figures", "judge", "sweep_limit"]
