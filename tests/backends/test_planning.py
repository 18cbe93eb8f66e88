"""The plan contract's shared arithmetic (release/backends/planning.py): a simple engine's whole plan is
`sized_per_load_plan`, so its figures are checked against hand-computed ones and its limits at the boundary."""

from __future__ import annotations

from dataclasses import replace

import pytest

from release.backends.planning import GIB, MIB, EnginePlan, Target, kv_bytes_per_sequence, sized_per_load_plan
from release.backends.shape import shape_from_config
from release.core.errors import InputError

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192}
TARGET = Target(memory_gib=80, concurrency=16, context=8192, provider="cuda", rollout_overlap=False)


def plan(target: Target = TARGET, overlap: int | None = None) -> EnginePlan:
    return sized_per_load_plan("simple", shape_from_config(LLAMA), "fp16", 16 * GIB, 2, target, 512 * MIB,
                               lambda batch, context: batch * 1000, overlap)


def test_the_figures_are_the_sum_of_their_parts() -> None:
    p = plan()
    kv = 16 * 2 * 8 * 128 * 2 * 32 * 8192   # concurrency x K and V x kv_heads x head_dim x bytes x layers x context
    assert p.kv_cache_bytes == kv == 16 * kv_bytes_per_sequence(shape_from_config(LLAMA), 2, 8192)
    assert p.kv_bytes_per_token == 2 * 8 * 128 * 2 * 32 == 131_072
    assert p.per_replica_bytes == 16 * GIB + kv + 16_000 + 512 * MIB == p.peak_bytes   # no overlap: a surge
    assert p.rollout_devices == 2 and p.kv_capacity_tokens is None
    assert p.fits == (p.peak_bytes <= p.budget_bytes) and p.checks[0].passed == p.fits


def test_the_limits_are_the_fitting_boundary() -> None:
    p = plan()
    assert plan(replace(TARGET, concurrency=p.max_concurrency)).fits
    assert not plan(replace(TARGET, concurrency=p.max_concurrency + 1)).fits


def test_a_shared_rollout_holds_the_old_replica_beside_the_new() -> None:
    shared = plan(replace(TARGET, rollout_overlap=True))
    assert shared.peak_bytes == 2 * shared.per_replica_bytes and shared.rollout_devices == 1
    smaller = plan(replace(TARGET, rollout_overlap=True), overlap=GIB)
    assert smaller.peak_bytes == shared.per_replica_bytes + GIB


def test_a_context_beyond_the_model_is_refused_naming_the_setting() -> None:
    with pytest.raises(InputError, match="max_position_embeddings 8192") as caught:
        plan(replace(TARGET, context=16384))
    assert "8192 or less" in (caught.value.hint or "")
