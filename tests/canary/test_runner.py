"""Whole canaries through the real router against the test backend: slow, identical, erroring, wrong,
shadow, and a rollback that wins. Steps of about a second each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from release.canary.runner import run_canary
from release.canary.settings import CanaryConfig
from tests.canary.backend import url


def quick(tmp: Path, **changes: Any) -> CanaryConfig:
    """Two short steps at 60 requests/s; rows 'reverse ... ->' with expected answers when `dataset`."""
    base: dict[str, Any] = {"steps": [30, 50], "step_requests": 60, "step_timeout_s": 15, "after_rollback_s": 0.5,
                            "traffic": {"rate": 60, "requests": 1, "output_tokens": 6, "warmup": 1}}
    base.update(changes)
    return CanaryConfig.model_validate(base)


def write_dataset(path: Path, rows: int = 24) -> str:
    letters = "abcdefgh"
    with path.open("w") as fh:
        for i in range(rows):
            word = [letters[(i + k) % 8] for k in range(3 + i % 3)]
            fh.write(json.dumps({"prompt": f"reverse {' '.join(word)} ->", "expected": " ".join(word[::-1]),
                                 "output_tokens": 8}) + "\n")
    return str(path)


def test_slow_candidate_fails_at_the_first_step_and_rolls_back(backend: str, tmp_path: Path) -> None:
    # An injected per-token delay: 6 ms per token instead of 1, the same time to the first token.
    config = quick(tmp_path, traffic={"rate": 60, "requests": 1, "output_tokens": 12, "warmup": 1})
    result = run_canary(url(backend, "1", 5, 1), url(backend, "2", 5, 6), config, tmp_path)
    assert result.outcome == "fail"
    assert [c.step for c in result.checks] == [1]
    failed = {m.metric for m in result.checks[0].judgement.metrics if m.verdict == "fail"}
    assert {"tpot_ms", "e2el_ms"} <= failed, [m.reason for m in result.checks[0].judgement.metrics]
    # The switch back: measured, immediate, nothing routed to the candidate after it, production clean.
    assert result.rollback_s is not None and 0 <= result.rollback_s < 5  # measured; a hang check only
    assert result.candidate_after_rollback == 0
    assert result.production_failures == 0 and result.client_failures == 0
    after = [r for r in result.records if r.step == "rollback"]
    assert after and all(r.backend == "production" and r.ok for r in after)
    assert result.records_path is not None and result.records_path.is_file()


def test_identical_candidate_passes_every_step(backend: str, tmp_path: Path) -> None:
    result = run_canary(url(backend, "1", 5, 1), url(backend, "2", 5, 1), quick(tmp_path), tmp_path)
    assert result.outcome == "pass", result.reason
    assert [c.weight for c in result.checks] == [30, 50]
    for check in result.checks:
        assert check.candidate_requests >= 10 and check.production_requests >= 10
        assert {m.metric for m in check.judgement.metrics} == {"ttft_ms", "tpot_ms", "e2el_ms", "error_rate"}
    # Warm-up requests exist but are never judged.
    assert any(r.step == "warmup" for r in result.records)
    assert result.rollback_s is None


def test_more_errors_fail_on_the_critical_error_rate_though_faster(backend: str, tmp_path: Path) -> None:
    config = quick(tmp_path, steps=[50], step_requests=80)
    result = run_canary(url(backend, "1", 8, 2), url(backend, "2", 2, 1, error_pct=40), config, tmp_path)
    assert result.outcome == "fail"
    metrics = {m.metric: m for m in result.checks[-1].judgement.metrics}
    assert metrics["error_rate"].verdict == "fail" and metrics["error_rate"].critical
    assert metrics["ttft_ms"].verdict == "pass" and (metrics["ttft_ms"].shift or 0) < 0
    assert result.checks[-1].judgement.reason.startswith("critical metric failed: error_rate")


def test_worse_answers_fail_on_output_quality_at_equal_latency(backend: str, tmp_path: Path) -> None:
    config = quick(tmp_path, traffic={"rate": 60, "requests": 1, "warmup": 1,
                                      "dataset": write_dataset(tmp_path / "eval.jsonl")})
    result = run_canary(url(backend, "1", 5, 1), url(backend, "2", 5, 1, answers="wrong"), config, tmp_path)
    assert result.outcome == "fail"
    metrics = {m.metric: m for m in result.checks[0].judgement.metrics}
    assert metrics["output_quality"].verdict == "fail"
    assert metrics["output_quality"].production == 1.0 and metrics["output_quality"].candidate == 0.0
    assert all(metrics[m].verdict == "pass" for m in ("ttft_ms", "e2el_ms"))


def test_shadow_users_see_only_production_and_the_judge_still_decides(backend: str, tmp_path: Path) -> None:
    config = quick(tmp_path, shadow=True, traffic={"rate": 60, "requests": 1, "warmup": 1,
                                                   "dataset": write_dataset(tmp_path / "eval.jsonl")})
    result = run_canary(url(backend, "1", 5, 1), url(backend, "2", 5, 1, answers="wrong"), config, tmp_path)
    assert result.outcome == "fail" and result.shadow
    assert "output_quality" in result.checks[0].judgement.reason
    assert result.views and all(v.backend == "production" and v.version == "1" for v in result.views)
    # Every answer a user got is production's (right) answer; the candidate's wrong ones were recorded only.
    assert not any(r.backend == "candidate" and not r.mirrored for r in result.records if r.step != "warmup")
    known = [v for v in result.views if v.status == 200]
    assert known and all(_answer(v.text) in _right_answers(tmp_path / "eval.jsonl") for v in known)
    assert any(r.backend == "candidate" and r.mirrored for r in result.records)


def _answer(sse: str) -> str:
    events = [json.loads(line[5:]) for line in sse.splitlines() if line.startswith("data:") and "[DONE]" not in line]
    return "".join(e["choices"][0]["text"] for e in events if e.get("choices"))


def _right_answers(path: Path) -> set[str]:
    return {json.loads(line)["expected"] for line in path.read_text().splitlines()}


def test_should_stop_wins_and_sets_the_candidate_to_zero(backend: str, tmp_path: Path) -> None:
    calls = {"n": 0}

    def stop() -> str | None:
        calls["n"] += 1
        return "production alias moved (rollback)" if calls["n"] > 1 else None

    result = run_canary(url(backend, "1", 5, 1), url(backend, "2", 5, 1), quick(tmp_path), tmp_path,
                        should_stop=stop)
    assert result.outcome == "stopped" and "rollback" in result.reason and not result.reason.startswith("stopped")
    assert not result.checks
    assert result.rollback_s is not None


def test_failure_threshold_rechecks_the_step(backend: str, tmp_path: Path) -> None:
    config = quick(tmp_path, failure_threshold=2, steps=[40])
    result = run_canary(url(backend, "1", 5, 1), url(backend, "2", 20, 6), config, tmp_path)
    assert result.outcome == "fail"
    assert [c.label for c in result.checks] == ["step-1", "step-1-check-2"]
