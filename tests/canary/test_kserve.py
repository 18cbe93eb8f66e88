"""The KServe canary manifest: the candidate pinned, canaryTrafficPercent set, both versions named."""

from __future__ import annotations

import pytest
import yaml

from release.canary.kserve import render_canary
from release.core.errors import InputError
from release.deploy.kserve import KServeOptions


def test_canary_manifest_pins_the_candidate_with_its_share() -> None:
    text = render_canary("tiny-llm", "4", "3", 10, KServeOptions(image="ghcr.io/acme/relctl:1", memory_gib=4))
    assert text.startswith("# relctl canary manifest: tiny-llm v4 at 10% beside production v3")
    manifest = yaml.safe_load(text)
    assert manifest["kind"] == "InferenceService"
    predictor = manifest["spec"]["predictor"]
    assert predictor["canaryTrafficPercent"] == 10
    assert predictor["containers"][0]["args"] == ["tiny-llm/4"]
    notes = manifest["metadata"]["annotations"]
    assert notes["relctl/candidate-version"] == "4" and notes["relctl/production-version"] == "3"
    assert notes["relctl/model-uri"] == "models:/tiny-llm/4"


def test_a_canary_on_gpus_is_scheduled_on_gpu_nodes() -> None:
    text = render_canary("tiny-llm", "4", "3", 10, KServeOptions(image="x", memory_gib=6, gpus=1))
    predictor = yaml.safe_load(text)["spec"]["predictor"]
    assert predictor["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert predictor["tolerations"][0]["key"] == "nvidia.com/gpu"


@pytest.mark.parametrize("percent", [0, 101])
def test_a_share_outside_1_to_100_is_refused(percent: int) -> None:
    with pytest.raises(InputError, match=r"within 1\.\.100"):
        render_canary("tiny-llm", "4", "3", percent, KServeOptions(image="x"))
