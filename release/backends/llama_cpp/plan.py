"""llama.cpp's memory plan of one llama-server replica (`EnginePlan`), as llama.cpp allocates it.

Per replica, in bytes (B = concurrent sequences, L = context tokens, u = tokens in one micro-batch):
    weights     = the GGUF's tensor bytes as stored (llama.cpp memory-maps the file); before anything is
                  built, the checkpoint's parameters x the precision's bytes per weight (BYTES_PER_WEIGHT)
    KV cache    = one unified pool (--kv-unified) of cells(B x L) cells x KV bytes per token, where
                  cells(n) rounds n up to llama.cpp's 256-cell step (llama-context.cpp: GGML_PAD(n_ctx, 256))
                  and KV bytes per token = layers x kv_heads x (key_length + value_length) x cache-type bytes
                  (gguf_facts.py; f16 cache unless the target names another KV dtype)
    compute     = ggml's compute buffer for one micro-batch of u = min(512, B x L) tokens: the hidden states
                  at the MLP or attention peak (planning.hidden_activation_bytes, f32) and u x vocab f32 logits
    overhead    = PROCESS_ALLOWANCE_BYTES: the binary, its threads and the HTTP server (measured, memory.py)
    overlap     = the replica being replaced, when a rolling update shares the devices (`relctl serve`
                  reloads in place: the new llama-server starts before the old one stops)
The target fits when weights + KV + compute + overhead + overlap <= devices x memory x (1 - headroom).
`measure`: the KV pool llama-server logged at start-up must match the plan's for the same slots and context:
its cells within KV_TOLERANCE, its MiB within the log's rounding (two decimals) plus KV_TOLERANCE; read from
the server validation and the gates already share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.backends.base import EngineMemory
from release.backends.llama_cpp.gguf_facts import CACHE_TYPE_BYTES, DEFAULT_CACHE_TYPE, GGUF_FILE, read_gguf
from release.backends.llama_cpp.memory import KV_CELL_PAD, PROCESS_ALLOWANCE_BYTES, kv_cells
from release.backends.planning import (
    GIB,
    MIB,
    Check,
    EnginePlan,
    Target,
    check_context,
    hidden_activation_bytes,
    largest,
)
from release.backends.shape import ModelShape, parameter_count, shape_from_config
from release.core.errors import InputError

# llama.cpp's default micro-batch (--ubatch-size 512): the most tokens one forward pass computes at once.
UBATCH_TOKENS = 512
# Bytes per weight of each precision as llama.cpp stores the matrices (ggml block sizes): f16 2; Q8_0 34 bytes
# per 32 weights; q4_K_M mixes Q4_K (144 bytes per 256) and Q6_K (210 per 256), about 4.9 bits per weight.
BYTES_PER_WEIGHT = {"fp16": 2.0, "q8_0": 34 / 32, "q4_K_M": 4.9 / 8}
# The target's KV dtype (`--kv-dtype`, relctl's names) -> llama.cpp's cache type (--cache-type-k/-v).
CACHE_TYPES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "q8_0"}
KV_TOLERANCE = 0.01
LOG_ROUNDING_MIB = 0.005  # llama.cpp logs the pool in MiB with two decimals


@dataclass(frozen=True)
class LlamaSpec:
    """What is planned: the model's shape, the precision, the weights' bytes and where each figure came from."""

    shape: ModelShape
    precision: str
    weights_bytes: int
    kv_bytes_per_token: int
    cache_type: str
    source: str            # "package" (the GGUF's own header and tensor bytes) or "config.json" (estimated)


def cache_type_of(target: Target) -> str:
    if target.kv_dtype is None:
        return DEFAULT_CACHE_TYPE
    if target.kv_dtype not in CACHE_TYPES:
        raise InputError(f"--kv-dtype: llama.cpp has no {target.kv_dtype} KV cache",
                         hint=f"use one of {', '.join(CACHE_TYPES)} for the llama-cpp engine")
    return CACHE_TYPES[target.kv_dtype]


def load_spec(source: Path, precision: str | None, target: Target, precisions: tuple[str, ...]) -> LlamaSpec:
    """A llama-cpp package (its GGUF), another engine's package or a config.json (weights estimated)."""
    from release.backends.package_facts import read_config_file, read_package  # noqa: PLC0415 - entry points

    if precision is not None and precision not in precisions:
        raise InputError(f"--precision: the llama-cpp plan lays out {', '.join(precisions)}, not {precision}",
                         hint=f"plan one of {', '.join(precisions)}")
    cache_type = cache_type_of(target)
    if source.is_file():
        shape = shape_from_config(read_config_file(source), source.name)
        return _estimated(shape, precision or "fp16", cache_type)
    facts = read_package(source)
    shape = shape_from_config(facts.config, f"{source.name}: config.json")
    gguf = facts.model_dir / GGUF_FILE
    if gguf.is_file() and precision in (None, facts.precision):
        header = read_gguf(gguf)
        return LlamaSpec(shape, facts.precision, header.weights_bytes, header.kv_bytes_per_token(cache_type),
                         cache_type, "package")
    return _estimated(shape, precision or (facts.precision if facts.precision in precisions else "fp16"), cache_type)


def _estimated(shape: ModelShape, precision: str, cache_type: str) -> LlamaSpec:
    weights = int(parameter_count(shape) * BYTES_PER_WEIGHT[precision])
    per_token = int(shape.layers * shape.kv_elements_per_layer * CACHE_TYPE_BYTES[cache_type])
    return LlamaSpec(shape, precision, weights, per_token, cache_type, "config.json")


def compute_bytes(shape: ModelShape, concurrency: int, context: int) -> int:
    """ggml's compute buffer for one micro-batch: hidden states at the peak and its logits, in f32."""
    tokens = min(UBATCH_TOKENS, concurrency * context)
    return hidden_activation_bytes(shape, tokens, 4) + tokens * shape.vocab * 4


def make_plan(engine: str, spec: LlamaSpec, target: Target, overlap_bytes: int | None,
              reported: EngineMemory | None = None, reported_slots: int = 1) -> EnginePlan:
    check_context(spec.shape, target.context)
    overhead = PROCESS_ALLOWANCE_BYTES * target.gpus

    def replica(concurrency: int, context: int) -> tuple[int, int, int, int]:
        cells = kv_cells(concurrency * context)
        kv = cells * spec.kv_bytes_per_token
        compute = compute_bytes(spec.shape, concurrency, context)
        return cells, kv, compute, spec.weights_bytes + kv + compute + overhead

    def peak(concurrency: int, context: int) -> int:
        one = replica(concurrency, context)[3]
        return one + (0 if not target.rollout_overlap else one if overlap_bytes is None else overlap_bytes)

    budget = int(target.capacity_bytes * (1 - target.headroom))
    cells, kv, compute, per_replica = replica(target.concurrency, target.context)
    top = peak(target.concurrency, target.context)
    fits = top <= budget
    most = largest(lambda n: peak(n, target.context) <= budget)
    longest = largest(lambda n: peak(target.concurrency, n) <= budget, limit=spec.shape.max_positions)
    load = f"{target.concurrency} x {target.context:,} tokens"
    summary = (f"{'fits' if fits else 'does not fit'} on llama.cpp: {spec.precision} at {load} ({cells:,} KV cells) "
               f"needs {top / GIB:.3f} GiB, budget {budget / GIB:.3f} GiB; largest concurrency at "
               f"{target.context:,} tokens: {most}; largest context at {target.concurrency}: {longest:,}")
    checks = [Check("peak_gib", round(top / GIB, 3), "<=", round(budget / GIB, 3), fits, "" if fits else summary)]
    details: dict[str, Any] = {"weights_source": spec.source, "cache_type": spec.cache_type, "kv_cells": cells,
                               "kv_cell_step": KV_CELL_PAD, "shape": spec.shape.to_dict(),
                               "ubatch_tokens": min(UBATCH_TOKENS, target.concurrency * target.context)}
    if reported is not None:
        # What llama-server allocated for its own slots and context, against the same arithmetic.
        # llama-server logs the cells exactly and the bytes in MiB with two decimals (0.005 MiB of rounding).
        planned_cells = kv_cells(reported_slots * reported.max_model_len)
        planned = planned_cells * spec.kv_bytes_per_token
        logged = reported.kv_cache_bytes or 0
        error = abs(planned_cells - reported.kv_cache_tokens) / max(reported.kv_cache_tokens, 1)
        off_mib = abs(planned - logged) / MIB
        allowed_mib = LOG_ROUNDING_MIB + KV_TOLERANCE * planned / MIB
        checks.append(Check("kv_cells_relative_error", round(error, 6), "<=", KV_TOLERANCE, error <= KV_TOLERANCE,
                            f"the plan's KV pool of {planned_cells:,} cells is {error:.1%} off what llama-server "
                            f"allocated ({reported.log_line})"))
        checks.append(Check("kv_pool_error_mib", round(off_mib, 6), "<=", round(allowed_mib, 6),
                            off_mib <= allowed_mib,
                            f"the plan's KV pool of {planned:,} B is {off_mib:.3f} MiB off what llama-server "
                            f"allocated ({reported.log_line})"))
        details["measured"] = {"kv_cache_tokens": reported.kv_cache_tokens, "kv_cache_bytes": logged,
                               "planned_kv_cells": planned_cells,
                               "planned_kv_bytes": planned, "slots": reported_slots,
                               "context": reported.max_model_len, "log_line": reported.log_line,
                               "relative_error": error, "resident_bytes": reported.resident_bytes,
                               "planned_replica_bytes": spec.weights_bytes + planned + PROCESS_ALLOWANCE_BYTES}
        details["cold_start"] = {"candidate": {"load_s": reported.start_s}, "metrics": {"load_s": reported.start_s},
                                 "note": "llama-server's start to ready (load included), measured, not judged"}
    return EnginePlan(engine=engine, fits=fits, summary=summary, target=target, precision=spec.precision,
                      weights_bytes=spec.weights_bytes, kv_bytes_per_token=spec.kv_bytes_per_token,
                      kv_cache_bytes=kv, kv_capacity_tokens=cells, activations_bytes=compute, overhead_bytes=overhead,
                      per_replica_bytes=per_replica, peak_bytes=top, budget_bytes=budget,
                      capacity_bytes=target.capacity_bytes, max_concurrency=most, max_context=longest,
                      rollout_devices=target.gpus if target.rollout_overlap else 2 * target.gpus,
                      checks=tuple(checks), details=details, native=spec)
