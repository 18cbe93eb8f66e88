"""The PyTorch reference computes in fp32 on a bf16 checkpoint held at bf16: its numbers are those of an fp32
load of the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from release.backends.torch_reference import TorchReference
from tests.backends.checkpoints import tiny_bf16_qwen


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    return tiny_bf16_qwen(tmp_path_factory.mktemp("bf16-qwen") / "checkpoint", tiny_checkpoint, tied=True)


def test_bf16_checkpoint_is_computed_in_fp32(bf16_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from release.backends import torch_reference

    monkeypatch.setattr(torch_reference, "VOCAB_ROWS", 7)  # the vocabulary projection in several slices
    reference = TorchReference(bf16_checkpoint)
    held = {p.dtype for p in reference._model.parameters()}
    assert held == {torch.bfloat16}  # the weights stay at the checkpoint's 2 bytes
    fp32 = AutoModelForCausalLM.from_pretrained(str(bf16_checkpoint), dtype=torch.float32).eval()
    prompts = [reference.encode("the model serves tokens"), reference.encode("a cache")]
    for ids in prompts:
        with torch.no_grad():
            expected = fp32(torch.tensor([ids])).logits[0].numpy()
        np.testing.assert_allclose(reference.logits(ids), expected, rtol=0, atol=1e-5)
    # The batched path (greedy continuation with a KV cache, then teacher-forced logits) agrees too, and
    # the weights are back at bf16 afterwards (the fp32 copies lived only while each module ran).
    for (continuation, logits), ids in zip(reference.batch_generate_with_logits(prompts, 6), prompts, strict=True):
        assert continuation == reference.generate_ids(ids, 6)
        with torch.no_grad():
            expected = fp32(torch.tensor([ids + continuation])).logits[0].numpy()
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4)
    assert {p.dtype for p in reference._model.parameters()} == {torch.bfloat16}
    # A bf16 computation differs from these numbers: the comparison above can tell them apart.
    bf16 = AutoModelForCausalLM.from_pretrained(str(bf16_checkpoint), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        rounded = bf16(torch.tensor([prompts[0]])).logits[0].float().numpy()
    assert np.abs(rounded - reference.logits(prompts[0])).max() > 1e-4
