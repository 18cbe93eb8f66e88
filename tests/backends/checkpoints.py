"""Tiny checkpoints the backend tests build: a bf16 Qwen2, the shape of Qwen2.5 in miniature."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def tiny_bf16_qwen(out: Path, tokenizer_from: Path, tied: bool) -> Path:
    """A 2-layer bf16 Qwen2 (GQA, qkv biases) in `out`, with `tokenizer_from`'s tokenizer and vocabulary;
    `tied`: embeddings shared with lm_head, as Qwen2.5-0.5B/1.5B have them (untied as Llama-3-8B)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, out / name)
    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=tied)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out
