"""The adapter of every family, on that family's real module names, merged bit-identically to peft's
merge_and_unload (fp32 bases from the matrix; bf16 and fp16 sharded bases in test_inputs.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from release.stages.merge import merge_checkpoint
from tests.families.conftest import Built
from tests.families.specs import FAMILIES
from tests.lora.helpers import assert_same_as_peft, changed_tensors, peft_merged, read_checkpoint


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_adapter_merges_like_peft(name: str, family_checkpoint: Callable[[str], Built], tmp_path: Path) -> None:
    built = family_checkpoint(name)
    out = tmp_path / "merged"
    report = merge_checkpoint(built.base, built.adapter, out)
    ours = read_checkpoint(out)
    assert_same_as_peft(ours, peft_merged(built.base, built.adapter, torch.float32))
    changed = changed_tensors(read_checkpoint(built.base), ours)
    # Every target module name of the family was found and folded, in every layer.
    for target in FAMILIES[name].lora_targets:
        assert {f"model.layers.{i}" for i in range(2)} <= {n.split(".self_attn")[0].split(".mlp")[0]
                                                           for n in changed if f".{target}." in n}, target
    assert report.lora_modules == 2 * len(FAMILIES[name].lora_targets)
