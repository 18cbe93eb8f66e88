"""Stage manifests: finished stages are resumed, changed inputs re-run, interrupted ones leave nothing finished."""

from __future__ import annotations

from pathlib import Path

import pytest

from release.core.progress import Progress
from release.pipeline.runner import Pipeline
from release.stages.base import Stage, StageInputs, StageResult, location


class WriteInputs(StageInputs):
    precision: str
    source: Path = location()


class WriteResult(StageResult):
    file: str


class WriteStage(Stage[WriteInputs, WriteResult]):
    name = "convert"
    result_type = WriteResult

    def __init__(self, inputs: WriteInputs, calls: list[str], text: str, crash: bool = False) -> None:
        super().__init__(inputs)
        self.calls, self.text, self.crash = calls, text, crash

    def run(self, out: Path) -> WriteResult:
        self.calls.append(self.text)
        (out / "out.txt").write_text(self.text)
        if self.crash:
            raise KeyboardInterrupt
        return WriteResult(file="out.txt")


def run(tmp_path: Path, calls: list[str], text: str, precision: str = "int4", source: str = "a",
        crash: bool = False) -> tuple[Path, bool]:
    done = Pipeline(tmp_path, Progress(quiet=True)).run(
        WriteStage(WriteInputs(precision=precision, source=Path(source)), calls, text, crash))
    return done.path(done.result.file), done.resumed


def test_finished_stage_is_resumed_and_a_changed_input_reruns(tmp_path: Path) -> None:
    calls: list[str] = []
    first, resumed = run(tmp_path, calls, "a")
    assert not resumed and first.read_text() == "a"
    again, resumed = run(tmp_path, calls, "b")
    assert resumed and again.read_text() == "a" and calls == ["a"]
    changed, resumed = run(tmp_path, calls, "c", precision="int8")
    assert not resumed and changed.read_text() == "c" and calls == ["a", "c"]
    # Both precisions keep their own folder: going back to int4 resumes, nothing is rebuilt.
    back, resumed = run(tmp_path, calls, "d")
    assert resumed and back.read_text() == "a" and calls == ["a", "c"]


def test_a_location_is_not_part_of_the_fingerprint(tmp_path: Path) -> None:
    calls: list[str] = []
    run(tmp_path, calls, "a", source="/one/place")
    _, resumed = run(tmp_path, calls, "b", source="/another/place")
    assert resumed and calls == ["a"]


def test_a_finished_output_changed_on_disk_is_rebuilt(tmp_path: Path) -> None:
    calls: list[str] = []
    first, _ = run(tmp_path, calls, "a")
    first.write_text("tampered")
    again, resumed = run(tmp_path, calls, "b")
    assert not resumed and again.read_text() == "b" and calls == ["a", "b"]


def test_interrupted_stage_leaves_nothing_finished(tmp_path: Path) -> None:
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, calls, "half", crash=True)
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.endswith(".partial")]
    again, resumed = run(tmp_path, calls, "ok")
    assert not resumed and again.read_text() == "ok" and calls == ["half", "ok"]
    assert not list(tmp_path.glob("*.partial"))
