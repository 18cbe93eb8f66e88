"""llama.cpp's memory, planned from a GGUF's header and read back from llama-server's own start-up log.

The plan of one replica (`replica_plan`): the weights as stored in the file (llama.cpp memory-maps them),
one KV pool of slots x context tokens at gguf_facts.kv_bytes_per_token (what --parallel/--kv-unified/
--ctx-size allocate, server.py; llama.cpp rounds the pool up to a multiple of 256 cells, llama-context.cpp),
plus a process allowance (the binary, its compute buffers and the HTTP server), a measured constant.
llama.cpp logs the pool it allocated (at --log-verbosity 4):

    llama_kv_cache: size = 0.06 MiB (256 cells, 2 layers, 1/1 seqs), K (f16): 0.03 MiB, V (f16): 0.03 MiB

which `engine_memory` returns, so a gate can hold the plan's KV tokens and bytes against the engine's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from release.backends.base import EngineMemory
from release.backends.llama_cpp.gguf_facts import DEFAULT_CACHE_TYPE, GgufFacts
from release.backends.llama_cpp.server import ServerProcess
from release.core.errors import StageFailed

MIB = 1024**2
# llama-context.cpp: `cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)`: the pool is allocated in 256-cell steps.
KV_CELL_PAD = 256
# The process beyond weights, KV and ggml's compute buffer (which plan.py counts on its own): llama-server's
# binary, its threads and the HTTP server. Measured (benchmarks/llama_cpp_memory.py): RSS minus weights, KV pool
# and the compute buffer llama-server logs is 15-21 MiB across 2 models x 2 precisions x 1-16 slots.
PROCESS_ALLOWANCE_BYTES = 16 * MIB
KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\)")
SLOT_LINE = re.compile(r"n_slots = (\d+), n_ctx_slot = (\d+)")


@dataclass(frozen=True)
class ReplicaPlan:
    """One llama-server replica's memory, in bytes, and what it serves."""

    weights_bytes: int
    kv_bytes: int
    process_bytes: int
    slots: int
    context: int
    kv_bytes_per_token: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.process_bytes

    @property
    def kv_tokens(self) -> int:
        """The cells llama.cpp allocates: slots x context, rounded up to its 256-cell step."""
        return kv_cells(self.slots * self.context)


def kv_cells(tokens: int) -> int:
    return -(-tokens // KV_CELL_PAD) * KV_CELL_PAD


def replica_plan(facts: GgufFacts, slots: int, context: int | None = None,
                 cache_type: str = DEFAULT_CACHE_TYPE) -> ReplicaPlan:
    """The memory of llama-server serving `slots` sequences of `context` tokens (default: the model's)."""
    tokens_each = context or facts.context_length
    per_token = facts.kv_bytes_per_token(cache_type)
    return ReplicaPlan(weights_bytes=facts.weights_bytes, kv_bytes=per_token * kv_cells(slots * tokens_each),
                       process_bytes=PROCESS_ALLOWANCE_BYTES, slots=slots, context=tokens_each,
                       kv_bytes_per_token=per_token)


def engine_memory(server: ServerProcess) -> EngineMemory:
    """The KV pool llama-server logged at start-up (cells = tokens), its slots and its RSS now."""
    text = server.log_path.read_text(errors="replace") if server.log_path.is_file() else ""
    found = KV_LINE.search(text)
    if found is None:
        raise StageFailed(f"llama-server logged no KV cache size line (log: {server.log_path})",
                          hint="llama.cpp logs 'llama_kv_cache: size = ...' while loading; check its log")
    slots = SLOT_LINE.search(text)
    cells = int(found[2])
    per_sequence = int(slots[2]) if slots else cells
    line = text[found.start():].splitlines()[0]
    # Concurrency: the slots it decodes at once, at most what the pool holds at full context each.
    n_slots = int(slots[1]) if slots else 1
    return EngineMemory(kv_cache_tokens=cells, max_concurrency=min(float(n_slots), cells / max(per_sequence, 1)),
                        max_model_len=per_sequence, log_line=line, start_s=server.start_s,
                        kv_cache_bytes=int(float(found[1]) * MIB), resident_bytes=server.resident_bytes())
