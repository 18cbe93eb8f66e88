"""The canary gate: the registered candidate serves a share of live traffic beside production, through
relctl's router; the judge (release/canary/judge.py) decides per step; a failed check sets the
candidate's weight to 0 at once. The gate moves no alias: the pipeline calls
release.canary.outcome.finish_canary with its result.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from gates.base import GateContext, GatePhase, GateResult
from release.canary.result import gate_result
from release.canary.runner import run_canary
from release.canary.servers import Registered, served
from release.canary.settings import CanaryConfig
from release.core.errors import ReleaseError


class CanaryGate:
    """Production and candidate each behind `relctl serve`, the steps walked through the router."""

    id: ClassVar[str] = "canary"
    Config: ClassVar[type[BaseModel]] = CanaryConfig
    phase: ClassVar[GatePhase] = "after_register"

    def __init__(self, config: CanaryConfig) -> None:
        self.config = config

    def run(self, context: GateContext) -> GateResult:
        if context.production is None:
            return GateResult(self.id, "skipped", "no production version (first release)")
        work = context.work_dir
        work.mkdir(parents=True, exist_ok=True)
        config = _with_dataset(self.config, context)
        try:
            with served(context.production.package_dir, context.package_dir, work, config,
                        _registered(context)) as (prod, cand):
                result = run_canary(prod.url, cand.url, config, work, base_dir=context.config_dir,
                                    should_stop=context.should_stop)
                servers = {"production": prod.info, "candidate": cand.info}
        except ReleaseError as exc:
            return GateResult(self.id, "fail", f"canary could not run: {exc.message}",
                              evidence=sorted(work.glob("*/server.log")))
        return gate_result(self.id, result, work, {"servers": servers,
                                                   "production_version": context.production.version,
                                                   "candidate_version": context.version})


def _registered(context: GateContext) -> Registered | None:
    """Both sides as registered versions when the pipeline says where their registry is (promote does):
    then each answer's X-Relctl-Version names the version that gave it."""
    if context.project_dir is None or context.version is None or context.production is None:
        return None
    return Registered(context.project_dir, context.model_name, context.production.version, context.version)


def _with_dataset(config: CanaryConfig, context: GateContext) -> CanaryConfig:
    """Without a dataset of its own the canary sends the run's eval set, so output quality is measured."""
    if config.traffic.dataset is not None:
        resolved = str(context.resolve(config.traffic.dataset))
    elif context.eval_dataset is not None and context.eval_dataset.is_file():
        resolved = str(context.eval_dataset)
    else:
        return config
    return config.model_copy(update={"traffic": config.traffic.model_copy(update={"dataset": resolved})})


__all__ = ["CanaryGate", "gate_result"]
