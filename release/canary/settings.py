"""`gates.canary` in release.yaml: steps, traffic, the judge's confidence and per-metric rules.

Metric rules given in release.yaml are merged over the defaults key by key (`ttft_ms: {critical: true}`
keeps the default tolerance); `null` drops a metric. Steps are the candidate's share of traffic in
percent (in shadow mode: the share of production's requests mirrored to the candidate).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from release.canary.judge import MetricRule
from release.core.server_settings import ServerSettings
from release.serving.loadgen.runner import Traffic

LATENCY_METRICS = ("ttft_ms", "tpot_ms", "e2el_ms")
# Latency may grow by 20% of production's median, or 1 ms, whichever is larger: the absolute floor keeps
# sub-millisecond jitter of a tiny model from counting as a regression.
_LATENCY = {"kind": "continuous", "bad": "increase", "allowed_relative": 0.2, "allowed_absolute": 1.0,
            "critical": False, "min_samples": 10}
DEFAULT_METRICS: dict[str, dict[str, Any]] = {
    **{name: dict(_LATENCY) for name in LATENCY_METRICS},
    "error_rate": {"kind": "proportion", "bad": "increase", "allowed_absolute": 0.01, "critical": True,
                   "min_samples": 10},
    # Exact match of the answer (after strip) on requests whose expected answer is known.
    "output_quality": {"kind": "proportion", "bad": "decrease", "allowed_absolute": 0.05, "critical": True,
                       "min_samples": 10},
}


class CanaryConfig(BaseModel):
    """`gates.canary`: what `relctl canary` and the canary gate run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[float] = Field(default=[10.0, 25.0, 50.0], min_length=1,
                               description="candidate share of traffic per step, percent (shadow: share mirrored)")
    step_requests: int = Field(default=150, ge=10, description="requests (all sides) each check waits for")
    step_timeout_s: float = Field(default=60.0, gt=0, description="a check runs with what it has after this")
    traffic: Traffic = Traffic(rate=20.0, requests=1, output_tokens=16, warmup=3)
    endpoint: Literal["completions", "chat"] = "completions"
    timeout_s: float = Field(default=30.0, gt=0, description="per request")
    confidence: float = Field(default=0.98, gt=0, lt=1, description="of the shift intervals (Kayenta: 0.98)")
    pass_score: float = Field(default=1.0, ge=0, le=1, description="share of metrics that must pass a check "
                              "(1: every metric, as Flagger; lower it for a Kayenta-style score)")
    failure_threshold: int = Field(default=1, ge=1, description="failed checks before the canary aborts")
    shadow: bool = Field(default=False, description="mirror production's requests instead of splitting them")
    after_rollback_s: float = Field(default=1.0, ge=0, description="traffic kept flowing after a rollback")
    server: ServerSettings | None = Field(default=None, description="settings of the servers relctl starts; "
                                          "default: each package's own")
    metrics: dict[str, MetricRule] = Field(default_factory=lambda: {
        k: MetricRule.model_validate(v) for k, v in DEFAULT_METRICS.items()})

    @field_validator("steps")
    @classmethod
    def _percent(cls, steps: list[float]) -> list[float]:
        for step in steps:
            if not 0 < step <= 100:
                raise ValueError(f"step {step:g}: a share of traffic in percent, above 0 and at most 100")
        return steps

    @field_validator("metrics", mode="before")
    @classmethod
    def _merge_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        merged: dict[str, Any] = {k: dict(v) for k, v in DEFAULT_METRICS.items()}
        for name, rule in value.items():
            if name not in DEFAULT_METRICS:
                raise ValueError(f"metric '{name}': unknown; the canary measures {', '.join(DEFAULT_METRICS)}")
            if rule is None:
                merged.pop(name)
            elif isinstance(rule, MetricRule):
                merged[name] = rule.model_dump()
            elif isinstance(rule, dict):
                merged[name] = {**merged[name], **rule}
            else:
                raise ValueError(f"metric '{name}': a mapping of rule fields, or null to drop it")
        return merged
