"""After a failed gate the later gates do not run (unless --keep-going), and the failure is shown with ✗; a
verdict line says its status once and is marked by its outcome (a pass is never a warning's `!`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from release.canary.result import gate_result
from release.canary.runner import CanaryResult, Outcome
from release.config import ReleaseConfig
from release.core.progress import Progress
from release.gating.contract import GateContext, GateResult
from release.gating.run import run_phase_gates
from release.pipeline.engines import EngineBuild, compare_engines


class _Verdict(BaseModel):
    status: str = "pass"


class FixedGate:
    """A gate whose verdict is its configuration; it records that it ran."""

    Config: ClassVar[type[BaseModel]] = _Verdict

    def __init__(self, gate_id: str, status: str, ran: list[str]) -> None:
        self.id = gate_id  # type: ignore[misc]
        self.status = status
        self.ran = ran

    def run(self, context: GateContext) -> GateResult:
        self.ran.append(self.id)
        return GateResult(gate=self.id, status=self.status, reason=f"{self.id} said {self.status}")  # type: ignore[arg-type]


def _run(tmp_path: Path, keep_going: bool) -> tuple[list[GateResult], list[str], str]:
    ran: list[str] = []
    gates = [FixedGate("eval", "pass", ran), FixedGate("memory", "fail", ran), FixedGate("load", "pass", ran)]
    stream = io.StringIO()

    def context_for(gate_id: str) -> GateContext:
        return GateContext(model_name="m", package_dir=tmp_path, work_dir=tmp_path / gate_id, production=None)

    results = run_phase_gates(gates, context_for, Progress(stream=stream), None,  # type: ignore[arg-type]
                              keep_going=keep_going)
    return results, ran, stream.getvalue()


def test_a_failed_gate_is_a_cross_and_the_later_gates_do_not_run(tmp_path: Path) -> None:
    results, ran, printed = _run(tmp_path, keep_going=False)
    assert ran == ["eval", "memory"]
    assert [r.status for r in results] == ["pass", "fail", "skipped"]
    assert results[2].reason.startswith("not run: gate 'memory' failed first") and "--keep-going" in results[2].reason
    lines = printed.splitlines()
    assert lines[0].startswith("✓ gate eval")
    assert lines[1].startswith("✗ gate memory") and "fail: memory said fail" in lines[1]
    assert lines[2].startswith("○ gate load") and "✓" not in lines[1] + lines[2]


def test_keep_going_runs_every_gate(tmp_path: Path) -> None:
    results, ran, printed = _run(tmp_path, keep_going=True)
    assert ran == ["eval", "memory", "load"]
    assert [r.status for r in results] == ["pass", "fail", "pass"]
    assert "✗ gate memory" in printed and "✓ gate load" in printed


class CanaryVerdict:
    """The canary's verdict as the canary gate reports it (release/canary/result.py's gate_result)."""

    id: ClassVar[str] = "canary"
    Config: ClassVar[type[BaseModel]] = _Verdict

    def __init__(self, outcome: Outcome, reason: str) -> None:
        self.outcome, self.reason = outcome, reason

    def run(self, context: GateContext) -> GateResult:
        return gate_result(self.id, CanaryResult(self.outcome, self.reason, [], False), context.work_dir)


def test_a_canary_line_says_its_status_once(tmp_path: Path) -> None:
    # Issue 38: "✓ gate canary ... pass: pass: 2 steps passed": the reason repeated the status.
    cases: list[tuple[Outcome, str, str]] = [
        ("pass", "2 steps passed, up to 50%", "pass: 2 steps passed, up to 50%"),
        ("fail", "step 1 (25%): ttft_ms", "fail: step 1 (25%): ttft_ms"),
        ("inconclusive", "step 1 (25%): too few", "fail: inconclusive: step 1 (25%)")]
    for outcome, reason, shown in cases:
        stream = io.StringIO()
        context = GateContext("m", tmp_path, tmp_path / outcome, None)

        def context_for(_gate_id: str, given: GateContext = context) -> GateContext:
            return given

        (result,) = run_phase_gates([CanaryVerdict(outcome, reason)], context_for, Progress(stream=stream), None)
        assert shown in stream.getvalue(), stream.getvalue()
        assert f"{result.status}: {result.status}:" not in stream.getvalue()


def test_a_passing_load_test_of_an_engines_comparison_is_no_warning(tmp_path: Path) -> None:
    # Issue 38: the comparison printed each load verdict as a note, "! engines: ... load pass: SLOs met".
    cfg = ReleaseConfig.model_validate({"engines": [{"backend": "onnxruntime-genai", "precision": "int4"},
                                                    {"backend": "onnxruntime-genai", "precision": "int8"}]})
    ran: list[str] = []
    stream = io.StringIO()
    compare_engines(cfg, [FixedGate("load", "pass", ran)],  # type: ignore[list-item]
                    lambda entry: EngineBuild({"passed": True, "metrics": {}}, tmp_path),
                    lambda entry, package: GateContext("m", package, tmp_path / entry.precision, None),
                    Progress(stream=stream))
    lines = [line for line in stream.getvalue().splitlines() if "load pass" in line or "pass: load said" in line]
    assert len(lines) == 2 and all(line.startswith("✓ load onnxruntime-genai") for line in lines), lines
    assert not any(line.startswith("!") for line in stream.getvalue().splitlines())
