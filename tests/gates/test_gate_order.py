"""After a failed gate the later gates do not run (unless --keep-going), and the failure is shown with ✗."""

from __future__ import annotations

import io
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from release.core.progress import Progress
from release.gating.contract import GateContext, GateResult
from release.gating.run import run_phase_gates


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
