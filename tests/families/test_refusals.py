"""What the builder cannot take is refused in seconds with its reason (exit 2), by `relctl check`, by the
first step of `relctl promote` and by `relctl convert`; an adapter recorded for another base is refused
naming both models."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.errors import EXIT_BAD_INPUT
from tests.families.conftest import Built, Shared, log_family_run

# Seconds: nothing slow may run before the refusal (a builder run alone takes longer on this machine).
QUICK_S = 8.0


def relctl(project: Path, *args: str) -> tuple[Result, float]:
    started = time.perf_counter()
    result = CliRunner().invoke(cli, ["--project-dir", str(project), *args])
    return result, time.perf_counter() - started


def edited(built: Built, out: Path, config: dict[str, Any] | None = None,
           adapter: dict[str, Any] | None = None) -> Path:
    checkpoint = shutil.copytree(built.checkpoint, out)
    for name, changes in (("config.json", config), ("adapter_config.json", adapter)):
        if changes:
            path = checkpoint / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return checkpoint


def refused(result: Result, seconds: float, *needles: str) -> str:
    assert result.exit_code == EXIT_BAD_INPUT, result.output + result.stderr
    assert seconds < QUICK_S, f"refused after {seconds:.1f}s"
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.output + result.stderr
    return result.stderr


def written(out: Path) -> list[Path]:
    """Files a refused stage command left in OUT (the standalone runner may leave OUT itself, empty)."""
    return list(out.rglob("*")) if out.exists() else []


UNBUILDABLE = {
    # SmolLM3-3B's real layout: every 4th layer without RoPE.
    "smollm3-nope": ("smollm3", {"no_rope_layers": [1, 0]}, "SmolLM3 layers without RoPE (no_rope_layers is 0 at [1])"),
    # LlamaModel's rope reader knows llama3 only: a linear-scaled Llama would build without its scaling.
    "llama-linear-rope": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}},
                          "rope type 'linear' on LlamaForCausalLM"),
    # head_dim 80 x 0.3 = 24 rotary dimensions: the fused rotary kernel needs rotary_dim / 2 a multiple of 8.
    "phi-partial-rotary": ("phi", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                       "partial_rotary_factor": 0.3}},
                           "rotary dimensions 24 (head_dim 80 x partial_rotary_factor 0.3)"),
}


@pytest.mark.parametrize("case", list(UNBUILDABLE))
def test_a_config_the_builder_cannot_take_is_refused_in_seconds(case: str, family_checkpoint: Callable[[str], Built],
                                                                family_shared: Shared, tmp_path: Path) -> None:
    family, changes, reason = UNBUILDABLE[case]
    checkpoint = edited(family_checkpoint(family), tmp_path / "checkpoint", config=changes)
    project = tmp_path / "project"
    project.mkdir()
    # The onnxruntime-genai backend by name: with `auto`, another installed backend (vLLM) may take the model.
    (project / "release.yaml").write_text("convert:\n  backend: onnxruntime-genai\n")
    run_id = log_family_run(project, checkpoint, family_shared.data_dir, experiment=family)
    refused(*relctl(project, "check", run_id), reason, "hint:")
    refused(*relctl(project, "promote", run_id, "--precision", "fp32"), reason)
    # convert on its own (the merged folder a user might hand it) refuses before the builder starts.
    base = shutil.copytree(checkpoint, tmp_path / "base",
                           ignore=shutil.ignore_patterns("adapter_config.json", "adapter_model.safetensors"))
    refused(*relctl(project, "convert", str(base), str(tmp_path / "onnx"), "--precision", "fp32",
                    "--backend", "onnxruntime-genai"), reason)
    assert written(tmp_path / "onnx") == []


def test_an_adapter_recorded_for_another_base_is_refused_with_both_names(
        family_checkpoint: Callable[[str], Built], family_shared: Shared, tmp_path: Path) -> None:
    # A Qwen2 adapter on a base that says it is Gemma (same shapes: the tensors alone cannot tell).
    checkpoint = edited(family_checkpoint("qwen2"), tmp_path / "checkpoint",
                        config={"_name_or_path": "google/gemma-2-2b"},
                        adapter={"base_model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    project = tmp_path / "project"
    project.mkdir()
    run_id = log_family_run(project, checkpoint, family_shared.data_dir, experiment="mismatch")
    names = ("'Qwen/Qwen2.5-0.5B'", "'google/gemma-2-2b'")
    refused(*relctl(project, "check", run_id), *names)
    refused(*relctl(project, "promote", run_id, "--precision", "fp32"), *names)
    refused(*relctl(project, "merge", str(checkpoint), str(checkpoint), str(tmp_path / "merged")), *names)
    assert written(tmp_path / "merged") == []


def test_an_unnamed_base_is_not_compared_and_says_so(family_checkpoint: Callable[[str], Built],
                                                     family_shared: Shared, tmp_path: Path) -> None:
    # transformers 5 writes no _name_or_path: the names cannot be compared, which check says.
    checkpoint = edited(family_checkpoint("qwen2"), tmp_path / "checkpoint",
                        adapter={"base_model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    project = tmp_path / "project"
    project.mkdir()
    run_id = log_family_run(project, checkpoint, family_shared.data_dir, experiment="unnamed")
    result, _ = relctl(project, "check", run_id)
    assert result.exit_code == 0, result.output + result.stderr
    assert "adapter/base names not compared: config.json _name_or_path (None) names no model" in result.stderr
