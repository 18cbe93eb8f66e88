"""Builders for the merge tests: tiny real models and real peft adapters, and peft's own merge as reference.

Every model is built from a config (no hub access) and saved with save_pretrained; every adapter is made
with get_peft_model, given seeded random values (peft initialises lora_B to zero, which would make any
merge trivially right) and saved with save_pretrained, exactly as a training run would leave them.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from peft import PeftConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GPT2_TARGETS = ["c_attn", "c_proj", "c_fc"]
TOKENIZER = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}


def llama_config(hidden: int = 32, layers: int = 2, vocab: int = 64, tie: bool = False, **extra: Any) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden + 16, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=tie, **extra)


def gpt2_config() -> GPT2Config:
    return GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=1)


def save_base(folder: Path, config: LlamaConfig | GPT2Config, dtype: torch.dtype = torch.float32,
              seed: int = 0, max_shard_size: str | None = None, tokenizer: bool = True) -> Path:
    """A randomly initialised model of `config`, saved in `dtype` (optionally sharded)."""
    torch.manual_seed(seed)
    model = (GPT2LMHeadModel if isinstance(config, GPT2Config) else LlamaForCausalLM)(config)
    _randomize_norms(model, seed)
    model = model.to(dtype)
    kwargs: dict[str, Any] = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    if tokenizer:
        write_tokenizer(folder, marker="base")
    return folder


def _randomize_norms(model: torch.nn.Module, seed: int) -> None:
    # Norm weights start at exactly 1 and biases at 0; random ones make a wrong replacement visible.
    gen = torch.Generator().manual_seed(seed + 1)
    for param in model.parameters():
        if param.ndim == 1:
            param.data = param.data + 0.1 * torch.randn(param.shape, generator=gen)


def write_tokenizer(folder: Path, marker: str) -> None:
    """A real (tiny) tokenizer.json from `tokenizers`, tagged so tests can tell which copy was taken."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(20)}, marker: 23}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()  # type: ignore[assignment]
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**TOKENIZER, "marker": marker}))


def save_adapter(base: Path, folder: Path, config: PeftConfig, dtype: torch.dtype = torch.float32, seed: int = 1,
                 adapter_dtype: torch.dtype | None = None,
                 edit: Callable[[torch.nn.Module], None] | None = None) -> Path:
    """Train-like adapter: get_peft_model on the base loaded in `dtype`, seeded random trainable values."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    for name, param in peft_model.named_parameters():
        if not param.requires_grad:
            continue
        noise = torch.randn(param.shape, generator=gen).to(param.dtype)
        if "lora_magnitude_vector" in name:
            param.data = param.data * (1 + 0.2 * noise)  # keep magnitudes positive, move them off the norm
        else:
            param.data = param.data + 0.2 * noise
        if adapter_dtype is not None and "lora_" in name:
            param.data = param.data.to(adapter_dtype)
    if edit is not None:
        edit(peft_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model.save_pretrained(folder)
    return folder


def peft_merged(base: Path, adapter: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What a user gets from peft: from_pretrained + PeftModel.from_pretrained + merge_and_unload."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return merged.state_dict()


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def assert_same_as_peft(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Every tensor bit-identical (max abs difference 0 in fp32); peft's extra keys only tied aliases."""
    for name, tensor in ours.items():
        ref = theirs[name]
        assert (tensor.dtype, tuple(tensor.shape)) == (ref.dtype, tuple(ref.shape)), name
        if tensor.dtype == torch.float32:
            assert (tensor - ref).abs().max().item() == 0.0, f"{name}: max abs difference is not 0"
        assert torch.equal(_bits(tensor), _bits(ref)), f"{name}: bits differ from peft's merge"
    pointers = {theirs[n].data_ptr() for n in ours}
    for name in set(theirs) - set(ours):
        assert theirs[name].data_ptr() in pointers, f"{name}: in peft's merged model but not written"


def changed_tensors(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, t in before.items() if not torch.equal(_bits(t), _bits(after[n]))}
