"""The safety gate: an offline, deterministic suite of probes judged by plug-in detectors.

A suite is data: JSONL lines {"id", "category", "prompt", "checks": [detector names], optional
"secret" (planted; must never come back), "payload" (what an injection asks for), "terms" (blocked
terms)}. The built-in suite is gates/suites/default-v1.jsonl; `gates.safety.suite` points at your own.
Per category the gate computes the violation rate (probes with any failed check / probes) and fails
when it exceeds `max_rate.<category>`. Failing transcripts are kept as JSONL evidence.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gates.base import GateContext, GateResult, GateStatus, Problem, ThresholdCheck, missing_file
from gates.detectors import Detector, SuiteCase, detector_group
from gates.jsonl import read_jsonl
from gates.packaged import complete, load_package_model
from release.core.errors import ConfigError, InputError
from release.core.hashing import sha256_file

DEFAULT_SUITE = Path(__file__).parent / "suites" / "default-v1.jsonl"
EVIDENCE_FILE = "safety-failures.jsonl"
MAX_EXAMPLES = 20


class SuiteLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    category: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    checks: list[str] = Field(min_length=1)
    secret: str | None = None
    payload: str | None = None
    terms: list[str] = Field(default_factory=list)


Rate = Annotated[float, Field(ge=0, le=1)]


class SafetyConfig(BaseModel):
    """`gates.safety` in release.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suite: Path | None = Field(default=None, description="suite JSONL; default: relctl's built-in default-v1")
    max_rate: dict[str, Rate] = Field(default_factory=dict, description="per category: highest violation rate")
    default_max_rate: float = Field(default=0.0, ge=0, le=1, description="for categories absent from max_rate")
    max_new_tokens: int = Field(default=24, ge=1, le=512)
    detectors: dict[str, str] = Field(
        default_factory=dict, description="check name -> installed detector replacing the built-in one"
    )
    detector_options: dict[str, dict[str, Any]] = Field(default_factory=dict)


def load_suite(path: Path, known_checks: set[str]) -> list[SuiteCase]:
    """The suite's cases; a bad line or an unknown check is an InputError naming the line."""
    cases: list[SuiteCase] = []
    seen: set[str] = set()
    for record in read_jsonl(path, "safety suite"):
        where = f"{path.name}: line {record.line}"
        try:
            line = SuiteLine.model_validate(record.data)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            raise InputError(f"{where}: {key}: {err['msg']}", hint="see gates/suites/default-v1.jsonl") from exc
        unknown = [c for c in line.checks if c not in known_checks]
        if unknown:
            raise InputError(f"{where}: unknown check '{unknown[0]}'",
                             hint=f"installed detectors: {', '.join(sorted(known_checks))}")
        if line.id in seen:
            raise InputError(f"{where}: duplicate id '{line.id}'", hint="give every probe its own id")
        seen.add(line.id)
        cases.append(SuiteCase(id=line.id, category=line.category, prompt=line.prompt,
                               checks=tuple(line.checks), line=record.line, secret=line.secret,
                               payload=line.payload, terms=tuple(line.terms)))
    if not cases:
        raise InputError(f"{path.name}: the safety suite is empty", hint="add probes or use the built-in suite")
    return cases


class SafetyGate:
    """Runs the packaged model on every probe of the suite and judges each response."""

    id: ClassVar[str] = "safety"
    Config: ClassVar[type[BaseModel]] = SafetyConfig

    def __init__(self, config: SafetyConfig) -> None:
        self.config = config

    def preflight(self, config_dir: Path | None) -> list[Problem]:
        found = missing_file("gates.safety.suite", self.config.suite, config_dir) if self.config.suite else None
        return [found] if found else []

    def run(self, context: GateContext) -> GateResult:
        suite_path = context.resolve(self.config.suite) if self.config.suite else DEFAULT_SUITE
        detectors = self._detectors()
        cases = load_suite(suite_path, set(detectors))
        self._check_categories(cases)
        model = load_package_model(context.package_dir)
        transcripts = [self._judge(case, complete(model, case.prompt, self.config.max_new_tokens), detectors)
                       for case in cases]
        failures = [t for t in transcripts if not t["passed"]]
        evidence = context.work_dir / EVIDENCE_FILE
        evidence.write_text("".join(json.dumps(t) + "\n" for t in failures))
        checks, metrics = self._rates(transcripts)
        status: GateStatus = "pass" if all(c.passed for c in checks) else "fail"
        return GateResult(
            gate=self.id, status=status, reason=_reason(checks, transcripts), metrics=metrics,
            thresholds=checks, evidence=[evidence],
            details={"suite": suite_path.name, "suite_sha256": sha256_file(suite_path), "probes": len(cases),
                     "failing_examples": failures[:MAX_EXAMPLES]},
        )

    def _detectors(self) -> dict[str, Detector]:
        group = detector_group()
        installed: dict[str, type[Detector]] = dict(group.loaded)
        names = {name: name for name in installed} | dict(self.config.detectors)
        for check, impl in self.config.detectors.items():
            group.get(impl, f"release.yaml: gates.safety.detectors.{check}")   # broken: its reason, exit 2
            if impl not in installed:
                raise ConfigError(f"release.yaml: gates.safety.detectors.{check}: no detector named '{impl}'",
                                  hint=f"installed detectors: {', '.join(sorted(installed))}")
        return {check: installed[impl](self.config.detector_options.get(check, {}))
                for check, impl in names.items()}

    def _check_categories(self, cases: list[SuiteCase]) -> None:
        categories = {c.category for c in cases}
        for name in self.config.max_rate:
            if name not in categories:
                raise ConfigError(f"release.yaml: gates.safety.max_rate.{name}: no such category in the suite",
                                  hint=f"suite categories: {', '.join(sorted(categories))}")

    @staticmethod
    def _judge(case: SuiteCase, response: str, detectors: dict[str, Detector]) -> dict[str, Any]:
        findings = {check: detectors[check].check(case, response) for check in case.checks}
        failed = [f"{check}: {f.reason}" for check, f in findings.items() if not f.passed]
        return {"id": case.id, "category": case.category, "prompt": case.prompt, "response": response,
                "passed": not failed, "why": "; ".join(failed)}

    def _rates(self, transcripts: list[dict[str, Any]]) -> tuple[list[ThresholdCheck], dict[str, float]]:
        totals: dict[str, list[bool]] = defaultdict(list)
        for t in transcripts:
            totals[t["category"]].append(not t["passed"])
        checks: list[ThresholdCheck] = []
        metrics: dict[str, float] = {}
        for category in sorted(totals):
            rate = sum(totals[category]) / len(totals[category])
            bound = self.config.max_rate.get(category, self.config.default_max_rate)
            metric = f"{category}_violation_rate"
            metrics[metric] = rate
            checks.append(ThresholdCheck(metric=metric, value=rate, op="<=", bound=bound, passed=rate <= bound))
        metrics["violation_rate"] = sum(not t["passed"] for t in transcripts) / len(transcripts)
        return checks, metrics


def _reason(checks: list[ThresholdCheck], transcripts: list[dict[str, Any]]) -> str:
    failed = [c for c in checks if not c.passed]
    if not failed:
        return f"{len(transcripts)} probes: every category within its max violation rate"
    parts = [f"{c.metric.removesuffix('_violation_rate')} {c.value:.2f} > max {c.bound:.2f}" for c in failed]
    return "violation rate over the limit: " + ", ".join(parts)
