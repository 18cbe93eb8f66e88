"""A tiny random Llama with a BPE tokenizer trained here, converted by onnxruntime-genai's builder and
wrapped as a relctl package. Serving mechanics only: the weights are random."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a", "tiny", "model",
    "serves", "requests", "on", "a", "small", "machine", "with", "numbers", "one", "two", "three", "and",
    "letters", "alpha", "beta", "gamma", "delta",
]


def build_hf_model(out: Path, hidden: int = 64, layers: int = 2, context: int = 2048) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) for i in range(300)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def build_genai(hf_dir: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
           "-p", "fp32", "-e", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        raise RuntimeError(f"genai builder failed: {done.stderr[-2000:]}")
    return out


def build_tiny_package(root: Path, name: str = "tiny-llm", serving: dict[str, Any] | None = None,
                       **model: int) -> Path:
    from release.backends import backend_for_folder
    from release.core.package import build_package

    hf = build_hf_model(root / "hf", **model)
    genai = build_genai(hf, root / "genai")
    fields = {"model_name": name, "precision": "fp32", "exporter": "genai", "lineage": {"run_id": "test"},
              "serving": serving or {}}
    build_package(root / "package", genai, hf, fields, backend_for_folder(genai))
    return root / "package"
