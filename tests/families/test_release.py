"""Every family the builder supports, released end to end: `relctl promote` at fp32, then quantized (int4;
int8 for Granite, see specs.py).

Each family's trained checkpoint (with its LoRA adapter) is logged as a training run in a fresh project
and promoted with no release.yaml (validation only, no gates): the adapter is merged, the model built by
onnxruntime-genai, validated against PyTorch on the merged checkpoint and registered. The fp32 build must compute what
transformers computes on the merged checkpoint (top-1 on every position of the validation prompts), and
the quantized build must pass the default validation thresholds against that reference.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.registry import Registry
from release.registry.store import resolve_store
from tests.families.conftest import Built, Shared, log_family_run
from tests.families.specs import FAMILIES

pytestmark = pytest.mark.slow


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def promoted(result: Result) -> dict[str, object]:
    assert result.exit_code == 0, result.output + result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    assert report["outcome"] == "released", report
    return report


def hf_parity(project: Path, merged_from: Built, prompts: list[str]) -> float:
    """Top-1 agreement of the released fp32 model with transformers on the PEFT-merged checkpoint."""
    import numpy as np
    import torch
    import transformers
    from peft import PeftModel

    from release.backends.onnxruntime_genai.model import GenaiModel

    # The fp32 promote's build (validation's reference is PyTorch on the checkpoint, not a build).
    (model_dir,) = [m.parent / "model" for m in (project / ".relctl" / "work").glob("*/convert-*/manifest.json")
                    if json.loads(m.read_text())["result"]["precision"] == "fp32"]
    onnx = GenaiModel.load(model_dir)
    base = transformers.AutoModelForCausalLM.from_pretrained(merged_from.base)
    merged = PeftModel.from_pretrained(base, merged_from.adapter).merge_and_unload().eval()
    same = total = 0
    for prompt in prompts:
        ids = onnx.encode(prompt)
        with torch.no_grad():
            theirs = merged(torch.tensor([ids])).logits[0].numpy()
        ours = onnx.logits(ids)
        same += int(np.sum(ours.argmax(-1) == theirs.argmax(-1)))
        total += len(ids)
    return same / total


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_releases_at_fp32_and_quantized(name: str, family_checkpoint: Callable[[str], Built],
                                          family_shared: Shared, tmp_path: Path) -> None:
    built = family_checkpoint(name)
    project = tmp_path / "project"
    project.mkdir()
    run_id = log_family_run(project, built.checkpoint, family_shared.data_dir, experiment=name)
    started = time.perf_counter()
    fp32 = promoted(relctl(project, "promote", run_id, "--precision", "fp32", "--json"))
    fp32_s = time.perf_counter() - started
    quantized = FAMILIES[name].quantized
    quant = promoted(relctl(project, "promote", run_id, "--precision", quantized, "--json"))
    quant_s = time.perf_counter() - started - fp32_s
    versions = Registry(resolve_store(project))
    assert versions.get_version(name, str(fp32["version"])).tags["relctl.precision"] == "fp32"
    assert versions.get_version(name, str(quant["version"])).tags["relctl.precision"] == quantized
    metrics = quant["validation"]["metrics"]  # type: ignore[index]
    # Trained logits: the quantized build keeps nearly every top-1 of its reference (the default threshold is 0.90).
    assert metrics["top1_agreement"] >= 0.9, metrics
    prompts = [json.loads(line)["prompt"] for line in
               (family_shared.data_dir / "validation" / "prompts.jsonl").read_text().splitlines()][:8]
    parity = hf_parity(project, built, prompts)
    print(f"{name}: build {built.seconds:.1f}s, fp32 {fp32_s:.1f}s, {quantized} {quant_s:.1f}s, "
          f"{quantized} top-1 {metrics['top1_agreement']:.3f}, fp32 vs transformers top-1 {parity:.3f}")
    assert parity >= 0.99, f"{name}: the fp32 build disagrees with transformers on {1 - parity:.1%} of positions"
