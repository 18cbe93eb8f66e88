"""Runs stages in order; each writes its outputs and a manifest, so a re-run resumes.

A stage is finished when `<work>/<stage>/manifest.json` exists with the same fingerprint (a hash of
its inputs and config). Outputs are built in `<stage>.partial/` and renamed when complete, so an
interrupted stage leaves nothing that looks finished.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.errors import InputError
from release.hashing import sha256_json
from release.progress import Progress

MANIFEST = "manifest.json"
StageFn = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class StageOutcome:
    name: str
    dir: Path
    outputs: dict[str, Any]
    seconds: float
    resumed: bool
    fingerprint: str

    def path(self, key: str) -> Path:
        """Stages report files relative to their own folder, so a resumed stage's paths stay valid."""
        return self.dir / str(self.outputs[key])


class Pipeline:
    def __init__(self, work_dir: Path, progress: Progress) -> None:
        self.work_dir = work_dir
        self.progress = progress
        self.outcomes: dict[str, StageOutcome] = {}

    def run(self, name: str, inputs: dict[str, Any], fn: StageFn, summary: Callable[[dict[str, Any]], str]) -> StageOutcome:
        """Run `fn(stage_dir)` (paths in its outputs relative to stage_dir) unless a finished manifest with the same input fingerprint exists."""
        fingerprint = sha256_json(inputs)
        final = self.work_dir / name
        manifest = final / MANIFEST
        if manifest.is_file():
            recorded = json.loads(manifest.read_text())
            if recorded.get("fingerprint") == fingerprint:
                outcome = StageOutcome(name, final, recorded["outputs"], recorded["seconds"], True, fingerprint)
                self.outcomes[name] = outcome
                self.progress.done(name, 0.0, summary(outcome.outputs), skipped=True)
                return outcome
        partial = self.work_dir / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        start = time.perf_counter()
        try:
            with self.progress.stage(name):
                outputs = fn(partial)
        except InputError:
            raise  # bad input is reported as its own single error line
        except BaseException:
            self.progress.failed(name, "failed")
            raise
        seconds = time.perf_counter() - start
        (partial / MANIFEST).write_text(
            json.dumps({"stage": name, "fingerprint": fingerprint, "inputs": inputs,
                        "outputs": outputs, "seconds": seconds}, indent=2, default=str)
        )
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        outcome = StageOutcome(name, final, outputs, seconds, False, fingerprint)
        self.outcomes[name] = outcome
        self.progress.done(name, seconds, summary(outcome.outputs))
        return outcome

