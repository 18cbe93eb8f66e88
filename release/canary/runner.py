"""One canary run: the router in front of production and candidate, traffic flowing continuously, one
check per step (the judge on that step's records), and on a failed check the candidate's weight set to 0
at once, with the time from the failed check to 0% measured.

Flagger's rule for repeated checks: a failed (or inconclusive) check counts; when `failure_threshold`
checks have failed the canary aborts, otherwise the same step is checked again on fresh samples.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from release.canary.judge import Proportion, StepJudgement, judge_step
from release.canary.settings import CanaryConfig
from release.canary.sources import records_data, side_records
from release.canary.traffic import ClientView, TrafficDriver, body_for, plan_requests
from release.serving.loadgen.client import ClientOptions
from release.serving.router import Router, RouterRecord, RouterServer, write_records

Outcome = Literal["pass", "fail", "inconclusive", "stopped"]
POLL_S = 0.02
# should_stop may ask a registry; inside a step it is asked this often, and always right before a check.
STOP_POLL_S = 0.25
COUNT_POLL_S = 0.1


@dataclass
class Check:
    """One check of one step."""

    step: int                 # 1-based step number
    label: str                # the router's step label of its records
    weight: float             # percent to the candidate (shadow: percent mirrored)
    judgement: StepJudgement
    production_requests: int
    candidate_requests: int
    started_s: float
    checked_s: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "label": self.label, "weight": self.weight,
                "production_requests": self.production_requests, "candidate_requests": self.candidate_requests,
                "started_s": self.started_s, "checked_s": self.checked_s, **self.judgement.to_json()}


@dataclass
class CanaryResult:
    outcome: Outcome
    reason: str
    checks: list[Check]
    shadow: bool
    rollback_s: float | None = None          # failed check -> candidate weight 0 applied in the router
    candidate_after_rollback: int | None = None  # requests the router sent the candidate after that
    production_failures: int = 0             # failed requests production served (all checks, and after)
    client_failures: int = 0                 # failed requests the users saw
    duration_s: float = 0.0
    records_path: Path | None = None
    records: list[RouterRecord] = field(default_factory=list, repr=False)
    views: list[ClientView] = field(default_factory=list, repr=False)

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "passed": self.passed, "reason": self.reason, "shadow": self.shadow,
                "rollback_s": self.rollback_s, "candidate_after_rollback": self.candidate_after_rollback,
                "production_failures": self.production_failures, "client_failures": self.client_failures,
                "duration_s": self.duration_s, "records": str(self.records_path) if self.records_path else None,
                "checks": [c.to_json() for c in self.checks]}


def run_canary(production_url: str, candidate_url: str, config: CanaryConfig, work_dir: Path,
               base_dir: Path | None = None, should_stop: Callable[[], str | None] | None = None,
               progress: Callable[[str], None] | None = None, models: dict[str, str] | None = None,
               headers: dict[str, dict[str, str]] | None = None) -> CanaryResult:
    """Walk the steps against two running OpenAI-compatible endpoints; never moves a registry alias.

    `models`/`headers` per side ("production", "candidate"): the `model` each side's requests are rewritten
    to and headers added to them (two adapter versions on one base server: the same URL twice).

    `should_stop` is polled while a step runs and between checks: a reason from it (e.g. "production
    alias moved: rollback") sets the candidate's weight to 0 at once and ends the canary as "stopped".
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _: None)
    router = Router(production_url, candidate_url, record_text=True, timeout_s=config.timeout_s, models=models,
                    headers=headers)
    needed = max((rule.min_samples for rule in config.metrics.values()), default=1)
    # Planned, not sent: the checks end the traffic; room for steps that wait for enough samples.
    per_step = [max(config.step_requests, math.ceil(4 * needed * 100 / w)) for w in config.steps]
    budget = sum(per_step) * (config.failure_threshold + 1)
    rate = config.traffic.rate or 1.0
    n = budget + int(rate * (config.after_rollback_s + config.step_timeout_s)) + 10
    offsets, requests = plan_requests(config.traffic, n, uuid.uuid4().hex[:8], base_dir)
    expected = {r.request_id: r.expected for r in requests if r.expected is not None}
    started = time.perf_counter()
    with RouterServer(router) as server:
        opts = ClientOptions(base_url=server.url, model=None, endpoint=config.endpoint, timeout_s=config.timeout_s)
        _warm_up(router, server.url, opts, requests, config.traffic.warmup)
        driver = TrafficDriver(opts, offsets, requests, keep_text=config.shadow).start()
        try:
            result = _walk(router, driver, config, expected, should_stop, say)
        finally:
            driver.stop()
    result.duration_s = time.perf_counter() - started
    result.records = list(router.records)
    result.views = driver.views
    result.production_failures = sum(1 for r in result.records
                                     if r.backend == "production" and not r.ok and r.step != "warmup")
    result.client_failures = sum(1 for v in driver.views if v.status != 200)
    result.records_path = write_records(work_dir / "router-records.jsonl", result.records)
    return result


def _walk(router: Router, driver: TrafficDriver, config: CanaryConfig, expected: dict[str, str],
          should_stop: Callable[[], str | None] | None, say: Callable[[str], None]) -> CanaryResult:
    checks: list[Check] = []
    failed = 0
    step_index, attempt = 0, 1
    while step_index < len(config.steps):
        weight = config.steps[step_index]
        label = f"step-{step_index + 1}" + (f"-check-{attempt}" if attempt > 1 else "")
        share = weight / 100.0
        router.set_weights(candidate=0.0 if config.shadow else share, shadow=share if config.shadow else 0.0,
                           step=label)
        began = time.perf_counter() - router.t0
        stop_reason = _wait_for_step(router, driver, label, config, expected, should_stop)
        if stop_reason is not None:
            return _stopped(router, checks, stop_reason, config)
        data = records_data(router.records, label, config.shadow, expected)
        judgement = judge_step(config.metrics, data, config.confidence, config.pass_score)
        checked = time.perf_counter()
        sides = side_records(router.records, label, config.shadow)
        checks.append(Check(step_index + 1, label, weight, judgement, len(sides["production"]),
                            len(sides["candidate"]), began, checked - router.t0))
        say(f"{label} {weight:g}%: {judgement.verdict} (score {judgement.score:.2f}) {judgement.reason}")
        if judgement.verdict == "pass":
            step_index, attempt = step_index + 1, 1
            continue
        failed += 1
        attempt += 1
        if failed >= config.failure_threshold:
            return _roll_back(router, driver, checks, judgement.verdict, checked, config)
    router.set_weights(candidate=0.0, shadow=0.0, step="done")
    return CanaryResult("pass", f"{len(config.steps)} steps passed, up to {max(config.steps):g}% "
                        f"{'mirrored' if config.shadow else 'of traffic'}", checks, config.shadow)


def _wait_for_step(router: Router, driver: TrafficDriver, label: str, config: CanaryConfig,
                   expected: dict[str, str], should_stop: Callable[[], str | None] | None) -> str | None:
    deadline = time.perf_counter() + config.step_timeout_s
    seen, done = 0, 0
    asked, counted = 0.0, 0.0
    while time.perf_counter() < deadline:
        now = time.perf_counter()
        if should_stop is not None and now - asked >= STOP_POLL_S:
            asked = now
            if (reason := should_stop()) is not None:
                return reason
        records = router.records
        current = len(records)
        done += sum(1 for r in records[seen:current] if r.step == label and not r.mirrored)
        seen = current
        if driver.exhausted:
            break
        # At a small share the candidate gets few requests: the check also waits until each metric has
        # the samples its rule needs on both sides, so a 10% step is judged instead of inconclusive.
        if done >= config.step_requests and now - counted >= COUNT_POLL_S:
            counted = now
            data = records_data(records, label, config.shadow, expected)
            if _enough(data, config) or _critical_failure(data, config):
                break
        time.sleep(POLL_S)
    return should_stop() if should_stop is not None else None


def _enough(data: dict[str, tuple[Any, Any]], config: CanaryConfig) -> bool:
    for name, rule in config.metrics.items():
        if name in data and min(_count(side) for side in data[name]) < rule.min_samples:
            return False
    return True


def _critical_failure(data: dict[str, tuple[Any, Any]], config: CanaryConfig) -> bool:
    """A critical metric already fails on its own full data: waiting for the others cannot save the step
    (a candidate that answers nothing never gives TPOT samples)."""
    critical = {name: rule for name, rule in config.metrics.items() if rule.critical and name in data}
    if not critical:
        return False
    judged = judge_step(critical, data, config.confidence, config.pass_score)
    return any(m.verdict == "fail" for m in judged.metrics)


def _count(side: Any) -> int:
    return side.n if isinstance(side, Proportion) else len(side)


def _roll_back(router: Router, driver: TrafficDriver, checks: list[Check], verdict: str, failed_at: float,
               config: CanaryConfig) -> CanaryResult:
    applied = router.set_weights(candidate=0.0, shadow=0.0, step="rollback")
    rollback_s = applied - failed_at
    # Traffic keeps flowing a little: production must serve it alone, without a failed request.
    end = time.perf_counter() + config.after_rollback_s
    while time.perf_counter() < end and not driver.exhausted:
        time.sleep(POLL_S)
    after = sum(1 for r in router.records if r.backend == "candidate" and r.scheduled_s >= applied - router.t0)
    last = checks[-1]
    outcome: Outcome = "inconclusive" if verdict == "inconclusive" else "fail"
    reason = f"step {last.step} ({last.weight:g}%): {last.judgement.reason}"
    return CanaryResult(outcome, reason, checks, config.shadow, rollback_s=rollback_s, candidate_after_rollback=after)


def _stopped(router: Router, checks: list[Check], reason: str, config: CanaryConfig) -> CanaryResult:
    started = time.perf_counter()
    applied = router.set_weights(candidate=0.0, shadow=0.0, step="stopped")
    # The outcome says "stopped"; the reason is only why (gate_result writes "stopped: <reason>" once).
    return CanaryResult("stopped", reason, checks, config.shadow, rollback_s=applied - started)


def _warm_up(router: Router, url: str, opts: ClientOptions, requests: list[Any], count: int) -> None:
    """`count` requests pinned to each side before the first step, labelled "warmup" and never judged."""
    router.set_weights(step="warmup")
    for side in ("production", "candidate"):
        for i in range(count):
            request = requests[i % len(requests)]
            try:
                httpx.post(opts.url, content=body_for(request, opts), timeout=opts.timeout_s,
                           headers={"Content-Type": "application/json", "X-Relctl-Pin": side,
                                    "X-Request-Id": f"warmup-{side}-{i}"})
            except httpx.HTTPError:
                pass  # a backend that is down shows up in the checks' error rate, not here
