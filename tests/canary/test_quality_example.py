"""Output quality on the real example: the trained tiny Llama as production, an undertrained run of the
same recipe (same architecture, so the same latency) as the candidate, both behind `relctl serve`, the
run's eval set ({"prompt", "expected"}) as traffic. The canary must fail on output quality alone."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from release.canary.runner import run_canary
from release.canary.servers import served
from release.canary.settings import CanaryConfig


def _package(checkpoint: Path, root: Path) -> Path:
    from release.backends import backend_for_folder
    from release.core.package import build_package
    from release.stages.convert import convert

    converted = convert(checkpoint, root / "onnx", "fp32")
    fields = {"model_name": "tiny-llm", "precision": "fp32", "exporter": {"name": converted.backend},
              "lineage": {"checkpoint": str(checkpoint)}, "serving": {}}
    build_package(root / "package", converted.out_dir, checkpoint, fields, backend_for_folder(converted.out_dir))
    return root / "package"


@pytest.mark.slow
def test_undertrained_candidate_fails_on_output_quality(tmp_path: Path, tiny_base_only: Path, tiny_data: Path,
                                                       tinyllm: ModuleType) -> None:
    weak_run = tinyllm.train_tiny_llm(tmp_path / "weak", tinyllm.TrainConfig(base_steps=8, lora_steps=1))
    weak = tmp_path / "weak-base"
    weak.mkdir()
    for f in weak_run.checkpoint_dir.iterdir():
        if not f.name.startswith("adapter_"):
            (weak / f.name).write_bytes(f.read_bytes())
    production = _package(tiny_base_only, tmp_path / "good")
    candidate = _package(weak, tmp_path / "bad")
    config = CanaryConfig.model_validate({
        "steps": [50], "step_requests": 40,
        "traffic": {"rate": 10, "requests": 1, "output_tokens": 12, "dataset": str(tiny_data / "eval.jsonl")}})
    with served(production, candidate, tmp_path / "work", config) as (prod, cand):
        result = run_canary(prod.url, cand.url, config, tmp_path / "work")
    metrics = {m.metric: m for m in result.checks[0].judgement.metrics}
    quality = metrics["output_quality"]
    assert result.outcome == "fail" and quality.verdict == "fail", result.reason
    # Production really answers (served answers match the eval set as the eval gate's exact_match; the
    # base-only model gets 40-60% of them right, run to run), the candidate hardly does; the check ended on
    # the critical metric, without waiting out the step's timeout.
    assert (quality.production or 0) >= 0.3 and (quality.candidate or 0) < 0.2
    assert (quality.production or 0) - (quality.candidate or 0) >= 0.25
    assert metrics["error_rate"].verdict == "pass"
    assert result.checks[0].checked_s - result.checks[0].started_s < config.step_timeout_s
