"""Harness tasks show their own metric (lm-eval's acc, an Inspect scorer's accuracy) for candidate and
production beside the paired verdict: in the gate's line (the promote output), its details (report.json), the
job summary and the model card. In process, on task runs as gates/harness/run.py hands them back."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.base import GateResult
from gates.eval_paired import describe_scores, harness_comparisons, with_verdicts
from gates.harness.results import TaskRun
from gates.harness.run import HarnessResults
from gates.samples import SampleScores
from release.gating.report import render_markdown
from release.pipeline.report import ReleaseReport, decision_table


def run(acc: list[float], loglikelihood: list[float]) -> TaskRun:
    ids = tuple(str(i) for i in range(len(acc)))
    return TaskRun(harness="lm-eval", harness_version="0.4.13", task="reverse_mc", tasks=["reverse_mc"], digests={},
                   config={}, scores=(SampleScores("lm_eval/reverse_mc/acc", "binary", True, ids, tuple(acc)),
                                      SampleScores("lm_eval/reverse_mc/target_loglikelihood", "continuous", True, ids,
                                                   tuple(loglikelihood))))


def test_each_tasks_score_for_candidate_and_production_sits_beside_the_paired_verdict(tmp_path: Path) -> None:
    candidate = run([1.0] * 9 + [0.0] * 3, [-0.5] * 12)
    production = run([1.0] * 8 + [0.0] * 4, [-0.6] * 12)
    results = HarnessResults([candidate], [production], tmp_path / "harness-samples.jsonl")
    comparisons, _ = harness_comparisons({"lm_eval/reverse_mc/acc": 0.05}, results.scores("candidate"),
                                         results.scores("production"), "production v1", 0.95)
    scores = with_verdicts(results.task_scores(), comparisons)
    acc = next(s for s in scores if s["metric"] == "acc")
    assert (acc["candidate"], acc["production"], acc["n"], acc["own"]) == (0.75, 8 / 12, 12, True)
    assert acc["paired"]["outcome"] == "underpowered" and acc["paired"]["against"] == "production v1"
    target = next(s for s in scores if s["metric"] == "target_loglikelihood")
    assert not target["own"] and target["paired"] is None and target["production"] == pytest.approx(-0.6)

    line = describe_scores(scores)   # appended to the gate's reason: the promote output line
    assert line == "lm-eval reverse_mc: acc 0.750 (production 0.667; paired: underpowered)"
    result = GateResult(gate="eval", status="underpowered", reason=f"...; {line}",
                        details={"paired": [c.as_dict() for c in comparisons], "harness_scores": scores})
    summary = render_markdown([result], "1")
    assert "#### eval: harness tasks" in summary
    assert "| lm-eval | reverse_mc | acc | 12 | 0.75 | 0.6667 | underpowered (needs about" in summary
    assert "| lm-eval | reverse_mc | target_loglikelihood | 12 | -0.5 | -0.6 | no margin |" in summary
    report = ReleaseReport(model="m", training_run="r", release_run=None, precision="int4",
                           gates=[{"gate": "eval", "status": result.status, "reason": result.reason,
                                   "thresholds": [], "details": result.details}])
    row = next(line for line in decision_table(report) if line.startswith("| gate `eval`"))
    assert r"reverse_mc acc 0.75 \(production 0.667\)" in row   # markdown-escaped: text, never structure


def test_without_production_the_candidates_score_is_shown_alone(tmp_path: Path) -> None:
    results = HarnessResults([run([1.0, 0.0], [-0.5, -0.7])], None, tmp_path / "samples.jsonl")
    scores = with_verdicts(results.task_scores(), [])
    assert describe_scores(scores) == "lm-eval reverse_mc: acc 0.500"
    assert describe_scores([]) is None
