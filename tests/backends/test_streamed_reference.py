"""The streamed reference (release/backends/streamed_reference.py: one pass over the layers per step, the
logits collected while generating) computes what the transformers reference computes: the same greedy
continuations and logits equal within fp32 tolerance, on the tiny checkpoint (Llama, fp32, untied) and on a
random Qwen2-shaped bf16 checkpoint (qkv biases, tied embeddings, GQA: the widened-weight path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from release.backends.streamed_reference import StreamedReference, load_checkpoint_reference, supported
from release.backends.torch_reference import TorchReference
from release.stages.reference import compute

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def qwen2_bf16(out: Path, source: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (source / name).is_file():
            (out / name).write_bytes((source / name).read_bytes())
    vocab = int(__import__("json").loads((source / "config.json").read_text())["vocab_size"])
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, rope_theta=1e6, eos_token_id=2, bos_token_id=1)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    return out


def prompts(reference: TorchReference) -> list[list[int]]:
    texts = ["the model serves", "a cache of tokens that the rollout gate reads", "weights", "slow disk"]
    return [reference.encode(t) for t in texts]


def compare(folder: Path, new_tokens: int) -> None:
    torch_ref = TorchReference(folder)
    streamed = StreamedReference(folder)
    ids = prompts(torch_ref)
    expected = torch_ref.batch_generate_with_logits(ids, new_tokens)
    got = streamed.batch_generate_with_logits(ids, new_tokens)
    for (cont_t, logits_t), (cont_s, logits_s) in zip(expected, got, strict=True):
        assert cont_s == cont_t
        assert logits_s.shape == logits_t.shape
        np.testing.assert_allclose(logits_s, logits_t, **TOLERANCE)
    # And through the stage's own summary (what reference.npz holds).
    for a, b in zip(compute(torch_ref, ids, new_tokens), compute(streamed, ids, new_tokens), strict=True):
        assert a.continuation == b.continuation
        np.testing.assert_allclose(a.next_logprobs, b.next_logprobs, **TOLERANCE)


def test_the_tiny_checkpoint_streamed_equals_transformers(tiny_base_only: Path) -> None:
    assert isinstance(load_checkpoint_reference(tiny_base_only), StreamedReference)  # validation uses it
    compare(tiny_base_only, 6)


def test_a_bf16_qwen2_with_tied_embeddings_streamed_equals_transformers(tmp_path: Path, tiny_base_only: Path) -> None:
    compare(qwen2_bf16(tmp_path / "qwen2", tiny_base_only), 5)


def test_an_unsupported_family_goes_to_transformers() -> None:
    assert supported({"model_type": "gpt2"}) is not None
    assert supported({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) is not None
    assert supported({"model_type": "qwen2", "use_sliding_window": False}) is None


@pytest.mark.parametrize("new_tokens", [0])
def test_no_new_tokens_is_the_prompt_logits_alone(tiny_base_only: Path, new_tokens: int) -> None:
    compare(tiny_base_only, new_tokens)


def test_the_reference_gives_torchs_thread_count_back(tiny_base_only: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's thread count is the whole process's: a reference computed inside a longer process (promote's
    later stages, a test session's in-process commands) sets its own for its computation only."""
    import torch

    import release.backends.streamed_reference as streamed

    before = torch.get_num_threads()
    monkeypatch.setattr(streamed, "threads_for_this_machine", lambda: before + 1)
    seen: list[int] = []
    reference = StreamedReference(tiny_base_only)
    forward = reference._forward
    monkeypatch.setattr(reference, "_forward", lambda *a: seen.append(torch.get_num_threads()) or forward(*a))
    reference.generate_with_logits(reference.encode("reverse b d a f ->"), 2)
    assert seen and set(seen) == {before + 1}  # its own count while it computes
    assert torch.get_num_threads() == before   # and the process's back afterwards
