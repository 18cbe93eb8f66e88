"""relctl's streaming merge against peft 0.21's merge_and_unload, variant by variant, bit for bit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig

from release.stages.merge import merge_checkpoint
from tests.lora.helpers import (
    GPT2_TARGETS,
    LLAMA_TARGETS,
    assert_same_as_peft,
    changed_tensors,
    gpt2_config,
    llama_config,
    peft_merged,
    read_checkpoint,
    save_adapter,
    save_base,
)

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32


@dataclass(frozen=True)
class Variant:
    model: str  # "llama" or "gpt2"
    dtype: torch.dtype
    lora: dict[str, Any]
    adapter_dtype: torch.dtype | None = None
    tie: bool = False
    # base tensors the adapter must change (so a merge that does nothing fails)
    must_change: tuple[str, ...] = field(default=())


Q0 = "model.layers.0.self_attn.q_proj.weight"
ATTN0 = "transformer.h.0.attn.c_attn.weight"
VARIANTS = {
    "lora-fp32": Variant("llama", FP32, {"r": 4, "lora_alpha": 8}, must_change=(Q0,)),
    "lora-fp16": Variant("llama", FP16, {"r": 4, "lora_alpha": 8}, must_change=(Q0,)),
    "lora-bf16": Variant("llama", BF16, {"r": 4, "lora_alpha": 8}, must_change=(Q0,)),
    "lora-bf16-adapter-on-fp32": Variant("llama", FP32, {"r": 4, "lora_alpha": 16}, adapter_dtype=BF16),
    "lora-fp16-adapter-on-bf16": Variant("llama", BF16, {"r": 4, "lora_alpha": 16}, adapter_dtype=FP16),
    "rslora-fp32": Variant("llama", FP32, {"r": 4, "lora_alpha": 8, "use_rslora": True}),
    "rslora-bf16": Variant("llama", BF16, {"r": 8, "lora_alpha": 4, "use_rslora": True}),
    "patterns-fp32": Variant("llama", FP32, {
        "r": 4, "lora_alpha": 8,
        "rank_pattern": {"layers.1.self_attn.q_proj": 6, "q_proj": 2, "^model.layers.0.mlp.down_proj": 3},
        "alpha_pattern": {"v_proj": 3, "layers\\.1\\..*proj": 5.5},
    }),
    "patterns-fp16": Variant("llama", FP16, {
        "r": 4, "lora_alpha": 8, "rank_pattern": {"o_proj": 7}, "alpha_pattern": {"model.layers.1.mlp.up_proj": 2},
    }),
    "modules-to-save-fp16": Variant("llama", FP16, {"r": 4, "lora_alpha": 8, "modules_to_save": ["lm_head"]},
                                    must_change=("lm_head.weight",)),
    "embedding-fp32": Variant("llama", FP32, {"r": 4, "lora_alpha": 8, "target_modules": ["embed_tokens", "q_proj"]},
                              must_change=("model.embed_tokens.weight",)),
    "embedding-bf16": Variant("llama", BF16, {"r": 4, "lora_alpha": 8, "target_modules": ["embed_tokens"]},
                              must_change=("model.embed_tokens.weight",)),
    "embedding-tied-fp16": Variant("llama", FP16, {"r": 4, "lora_alpha": 8, "target_modules": ["embed_tokens"]},
                                   tie=True, must_change=("model.embed_tokens.weight",)),
    "dora-fp32": Variant("llama", FP32, {"r": 4, "lora_alpha": 8, "use_dora": True}, must_change=(Q0,)),
    "dora-fp16": Variant("llama", FP16, {"r": 4, "lora_alpha": 8, "use_dora": True}),
    "dora-bf16": Variant("llama", BF16, {"r": 4, "lora_alpha": 8, "use_dora": True}),
    "dora-rslora-patterns-bf16": Variant("llama", BF16, {
        "r": 4, "lora_alpha": 8, "use_dora": True, "use_rslora": True, "rank_pattern": {"k_proj": 2},
    }),
    "dora-embedding-fp32": Variant("llama", FP32, {
        "r": 4, "lora_alpha": 8, "use_dora": True, "target_modules": ["embed_tokens", "v_proj"],
    }, must_change=("model.embed_tokens.weight",)),
    "dora-embedding-bf16": Variant("llama", BF16, {
        "r": 4, "lora_alpha": 8, "use_dora": True, "target_modules": ["embed_tokens"],
    }),
    "conv1d-fp32": Variant("gpt2", FP32, {"r": 4, "lora_alpha": 8, "target_modules": GPT2_TARGETS},
                           must_change=(ATTN0, "transformer.h.0.attn.c_proj.weight")),
    "conv1d-fp16": Variant("gpt2", FP16, {"r": 4, "lora_alpha": 8, "target_modules": GPT2_TARGETS,
                                          "fan_in_fan_out": True}),
    "conv1d-dora-bf16": Variant("gpt2", BF16, {"r": 4, "lora_alpha": 8, "target_modules": GPT2_TARGETS,
                                               "use_dora": True}),
    "conv1d-dora-fp32": Variant("gpt2", FP32, {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn", "c_fc"],
                                               "use_dora": True}, must_change=(ATTN0,)),
    "bias-all-fp16": Variant("gpt2", FP16, {"r": 4, "lora_alpha": 8, "target_modules": GPT2_TARGETS, "bias": "all"},
                             must_change=("transformer.h.0.ln_1.bias", "transformer.h.0.attn.c_attn.bias")),
    "bias-lora-only-fp32": Variant("gpt2", FP32, {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"],
                                                  "bias": "lora_only"},
                                   must_change=("transformer.h.0.attn.c_attn.bias",)),
    "lora-bias-fp32": Variant("gpt2", FP32, {"r": 4, "lora_alpha": 8, "target_modules": GPT2_TARGETS,
                                             "lora_bias": True}, must_change=("transformer.h.1.mlp.c_fc.bias",)),
    "lora-bias-bf16": Variant("gpt2", BF16, {"r": 4, "lora_alpha": 8, "target_modules": GPT2_TARGETS,
                                             "lora_bias": True, "bias": "all"}),
    "lora-bias-llama-fp16": Variant("llama", FP16, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
                                                    "lora_bias": True},
                                    must_change=("model.layers.0.self_attn.q_proj.bias",)),
}


def _build(tmp_path: Path, variant: Variant) -> tuple[Path, Path]:
    if variant.model == "gpt2":
        config: Any = gpt2_config()
    else:
        config = llama_config(tie=variant.tie, attention_bias="lora_bias" in variant.lora)
    base = save_base(tmp_path / "base", config, variant.dtype)
    lora = {"target_modules": LLAMA_TARGETS, **variant.lora}
    adapter = save_adapter(base, tmp_path / "adapter", LoraConfig(**lora), variant.dtype,
                           adapter_dtype=variant.adapter_dtype)
    return base, adapter


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_merge_is_bit_identical_to_peft(tmp_path: Path, name: str) -> None:
    variant = VARIANTS[name]
    base, adapter = _build(tmp_path, variant)

    report = merge_checkpoint(base, adapter, tmp_path / "merged")

    ours = read_checkpoint(tmp_path / "merged")
    assert_same_as_peft(ours, peft_merged(base, adapter, variant.dtype))
    changed = changed_tensors(read_checkpoint(base), ours)
    assert set(variant.must_change) <= changed
    assert report.lora_modules > 0
    assert report.tensors_changed == len(changed)  # every tensor the merge rewrote differs from the base
