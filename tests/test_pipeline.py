"""Stage manifests: finished stages are skipped on a re-run, interrupted ones leave nothing finished."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from release.pipeline import Pipeline
from release.progress import Progress


def writer(calls: list[str], text: str) -> Any:
    def fn(stage_dir: Path) -> dict[str, Any]:
        calls.append(text)
        (stage_dir / "out.txt").write_text(text)
        return {"file": "out.txt"}
    return fn


def test_finished_stage_is_resumed_and_a_changed_input_reruns(tmp_path: Path) -> None:
    calls: list[str] = []
    first = Pipeline(tmp_path, Progress(quiet=True)).run("convert", {"precision": "int4"}, writer(calls, "a"), str)
    assert not first.resumed and first.path("file").read_text() == "a"
    again = Pipeline(tmp_path, Progress(quiet=True)).run("convert", {"precision": "int4"}, writer(calls, "b"), str)
    assert again.resumed and again.path("file").read_text() == "a" and calls == ["a"]
    changed = Pipeline(tmp_path, Progress(quiet=True)).run("convert", {"precision": "int8"}, writer(calls, "c"), str)
    assert not changed.resumed and changed.path("file").read_text() == "c" and calls == ["a", "c"]


def test_interrupted_stage_leaves_nothing_finished(tmp_path: Path) -> None:
    def crash(stage_dir: Path) -> dict[str, Any]:
        (stage_dir / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Pipeline(tmp_path, Progress(quiet=True)).run("merge", {"a": 1}, crash, str)
    assert not (tmp_path / "merge").exists()
    calls: list[str] = []
    done = Pipeline(tmp_path, Progress(quiet=True)).run("merge", {"a": 1}, writer(calls, "ok"), str)
    assert not done.resumed and calls == ["ok"] and not (tmp_path / "merge.partial").exists()
