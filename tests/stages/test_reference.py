"""The reference validation compares with is the checkpoint's own numbers (PyTorch), computed once, and an
onnxruntime-genai promote runs the model builder once: an fp32 release is checked against numbers it did
not compute itself, so a wrong build fails validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from release.backends import get_backend
from release.cli import cli
from release.config import ValidationConfig
from release.stages import reference as reference_stage
from release.stages.convert import convert
from release.stages.merge import merge_checkpoint
from release.stages.reference import REFERENCE_FILE, ReferenceInputs, ReferenceStage
from release.stages.validate import load_prompts, validate
from tests.stages.test_promote import MODEL, load_train_module

# What an fp32 build must meet against PyTorch on the same weights: only float rounding apart.
FP32 = ValidationConfig(min_top1_agreement=0.999, max_mean_kl=1e-6, max_perplexity_increase=1e-4,
                        min_greedy_agreement=1.0)


@pytest.fixture(scope="module")
def fp32_build(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reference")
    merged = root / "merged"
    merge_checkpoint(tiny_checkpoint, tiny_checkpoint, merged)
    return {"merged": merged, "fp32": convert(merged, root / "fp32", "fp32").out_dir}


@pytest.fixture(scope="module")
def saved_reference(fp32_build: dict[str, Path], tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> Path:
    """The reference stage's folder, computed by its worker process on the merged checkpoint."""
    out = tmp_path_factory.mktemp("reference-stage")
    prompts = tiny_data / "validation" / "prompts.jsonl"
    stage = ReferenceStage(ReferenceInputs(upstream="x", backend="onnxruntime-genai", prompts_sha256="x",
                                           max_new_tokens=FP32.max_new_tokens, checkpoint=fp32_build["merged"],
                                           prompts_path=prompts))
    result = stage.run(out)
    assert result.prompts == len(load_prompts(prompts)) and result.peak_rss_bytes > 0
    return out


def run(reference: Path, candidate: Path, merged: Path, tiny_data: Path) -> Any:
    return validate(reference, candidate, load_prompts(tiny_data / "validation" / "prompts.jsonl"),
                    merged / "tokenizer.json", FP32, get_backend("onnxruntime-genai"))


def test_fp32_build_matches_pytorch_on_the_checkpoint(fp32_build: dict[str, Path], saved_reference: Path,
                                                     tiny_data: Path) -> None:
    result = run(saved_reference, fp32_build["fp32"], fp32_build["merged"], tiny_data)
    assert result.passed, result.failures
    assert result.metrics["mean_kl"] < 1e-8 and result.metrics["top1_agreement"] == 1.0
    # The saved reference and a live one (the checkpoint folder itself) are the same numbers.
    live = run(fp32_build["merged"], fp32_build["fp32"], fp32_build["merged"], tiny_data)
    assert live.metrics["top1_agreement"] == result.metrics["top1_agreement"]
    assert abs(live.metrics["mean_kl"] - result.metrics["mean_kl"]) < 1e-9


def test_a_corrupted_fp32_weight_fails_validation(fp32_build: dict[str, Path], saved_reference: Path,
                                                 tiny_data: Path, tmp_path: Path) -> None:
    broken = tmp_path / "fp32"
    shutil.copytree(fp32_build["fp32"], broken)
    data = broken / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    middle = (len(raw) // 2) // 4 * 4
    patch = np.full(4096, 0.5, dtype=np.float32).tobytes()
    raw[middle:middle + len(patch)] = patch  # 16 KB of one layer's weights set to 0.5: a wrong build
    data.write_bytes(bytes(raw))
    result = run(saved_reference, broken, fp32_build["merged"], tiny_data)
    assert not result.passed
    assert any(f.startswith(("mean_kl", "top1_agreement")) for f in result.failures), result.failures


def test_the_saved_reference_refuses_other_prompts(fp32_build: dict[str, Path], saved_reference: Path,
                                                  tiny_data: Path) -> None:
    from release.core.errors import InputError

    prompts = load_prompts(tiny_data / "validation" / "prompts.jsonl")[:2]
    with pytest.raises(InputError, match="other prompts"):
        validate(saved_reference, fp32_build["fp32"], prompts, fp32_build["merged"] / "tokenizer.json", FP32,
                 get_backend("onnxruntime-genai"))


def test_top_k_summary_keeps_argmax_and_next_token(fp32_build: dict[str, Path]) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 9000)).astype(np.float32)
    logits[2, 17] = logits[2].max() + 1
    ref = reference_stage.summarize([1, 2, 3], [4, 5], logits)
    assert ref.top_ids.shape == (5, reference_stage.TOP_K)
    assert list(ref.top_ids[:, 0]) == list(logits.argmax(-1))
    logp = reference_stage.log_softmax(logits.astype(np.float64))
    assert np.allclose(ref.next_logprobs, logp[np.arange(4), [2, 3, 4, 5]])


def test_int4_promote_runs_the_builder_once_and_fp32_compares_with_pytorch(tmp_path: Path, tiny_run: Any) -> None:
    project = tmp_path / "project"
    project.mkdir()
    run_id = load_train_module().log_run(tiny_run, project, experiment=MODEL)
    for precision in ("int4", "fp32"):
        result = CliRunner().invoke(cli, ["--project-dir", str(project), "promote", run_id, "--precision",
                                          precision, "--json"])
        assert result.exit_code == 0, result.output + result.stderr
        report = json.loads(result.stdout)
        assert {"reference", "convert", "validate"} <= set(report["stages"])
    work = project / ".relctl" / "work"
    # Every builder run leaves its command line in a convert log: one per promote, none for the reference.
    logs = sorted(work.rglob("*.convert.log"))
    runs = [log for log in logs if "build_process" in log.read_text().splitlines()[0]]
    assert len(runs) == 2 and {p.parent.name.split("-")[0] for p in runs} == {"convert"}
    # One reference for both precisions (its fingerprint has no precision in it), and no ONNX in it.
    (reference,) = [p for p in work.glob("*/reference-*") if p.is_dir()]
    assert (reference / REFERENCE_FILE).is_file() and not list(reference.rglob("*.onnx"))
    assert report["validation"]["metrics"]["mean_kl"] < 1e-6  # fp32 against PyTorch: rounding only
