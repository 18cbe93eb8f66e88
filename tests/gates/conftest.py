"""Session packages for the gate tests, each built once: merge -> convert (ONNX, genai builder) -> package.

- trained_package: the shared tiny_checkpoint (task + safety slice), fp32.
- unsafe_package: the same recipe trained without the safety slice.
- half_tuned_package: the same recipe with half the LoRA steps: a release slightly worse than trained.
- undertrained_package: the same recipe with a fraction of the steps (fails the eval thresholds).
- eval_set: the example run's held-out eval.jsonl.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from release.backends import backend_for_folder
from release.core.package import build_package
from release.stages.convert import convert
from release.stages.merge import merge_checkpoint

# A few dozen steps: the model has started on the task but gets most answers wrong.
UNDERTRAINED_STEPS = {"base_steps": 40, "lora_steps": 10}


def package_checkpoint(checkpoint: Path, out: Path, precision: str = "fp32") -> Path:
    """The relctl package for `checkpoint`, built the way promote builds it."""
    merged = out / "merged"
    merge_checkpoint(checkpoint, checkpoint, merged)
    convert(merged, out / "onnx", precision)  # type: ignore[arg-type]
    build_package(out / "package", out / "onnx", merged, {"model_name": "tiny-llm", "precision": precision},
                  backend_for_folder(out / "onnx"))
    return out / "package"


@pytest.fixture(scope="session")
def trained_package(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    return package_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("pkg-trained"))


@pytest.fixture(scope="session")
def unsafe_package(tmp_path_factory: pytest.TempPathFactory, tiny_unsafe_checkpoint: Path) -> Path:
    return package_checkpoint(tiny_unsafe_checkpoint, tmp_path_factory.mktemp("pkg-unsafe"))


@pytest.fixture(scope="session")
def half_tuned_package(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType) -> Path:
    out = tmp_path_factory.mktemp("tiny-llm-half-tuned")
    steps = tinyllm.TrainConfig().lora_steps // 2
    run = tinyllm.train_tiny_llm(out, tinyllm.TrainConfig(lora_steps=steps))
    return package_checkpoint(run.checkpoint_dir, out / "build")


@pytest.fixture(scope="session")
def undertrained_package(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType) -> Path:
    out = tmp_path_factory.mktemp("tiny-llm-undertrained")
    run = tinyllm.train_tiny_llm(out, tinyllm.TrainConfig(**UNDERTRAINED_STEPS))
    return package_checkpoint(run.checkpoint_dir, out / "build")


@pytest.fixture(scope="session")
def eval_set(tiny_data: Path) -> Path:
    return tiny_data / "eval.jsonl"
