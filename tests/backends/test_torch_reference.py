"""The PyTorch reference computes in fp32 on a bf16 checkpoint held at bf16: its numbers are those of an fp32
load of the same checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from release.backends.torch_reference import TorchReference


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("bf16-qwen") / "checkpoint"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoint / name, out / name)
    vocab = json.loads((tiny_checkpoint / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


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
