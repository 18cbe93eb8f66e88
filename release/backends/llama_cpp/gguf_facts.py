"""What a GGUF file says about itself, read with llama.cpp's own gguf-py: the facts the memory plan, the
server and validation need, never assumed from a precision's name.

KV arithmetic, as llama.cpp allocates its cache (llama-kv-cache.cpp: one K and one V tensor per layer of
n_embd_k_gqa = head_count_kv x key_length and n_embd_v_gqa = head_count_kv x value_length elements per
token, at the cache type, f16 unless --cache-type-k/-v say otherwise):

    KV bytes per token = block_count x head_count_kv x (key_length + value_length) x cache-type bytes
                       = layers x kv_heads x head_dim x 2 x 2   (f16 cache, key_length = value_length)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.backends.llama_cpp.toolchain import gguf_module

GGUF_FILE = "model.gguf"
# llama.cpp's KV cache types (ggml type name -> bytes per element); the server's default is f16.
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}
DEFAULT_CACHE_TYPE = "f16"
# ggml types of a k-quant: a q4_K_M file mixes Q4_K and Q6_K (llama-quant.cpp).
K_QUANT_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"})


@dataclass(frozen=True)
class GgufFacts:
    """One GGUF file's architecture, sizes and tokenizer facts."""

    architecture: str
    file_type: int
    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    context_length: int
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool
    control_token_ids: frozenset[int]
    chat_template: str | None
    weights_bytes: int                  # the bytes of every tensor's data, as stored
    tensor_types: dict[str, str]        # tensor name -> ggml type name (F32, F16, Q8_0, Q4_K, ...)

    def kv_bytes_per_token(self, cache_type: str = DEFAULT_CACHE_TYPE) -> int:
        return kv_bytes_per_token(self.block_count, self.head_count_kv, self.key_length, self.value_length,
                                  cache_type)

    def matrix_types(self) -> dict[str, str]:
        """The 2-D weight tensors' types (norms and biases stay F32 at every precision)."""
        return {name: kind for name, kind in self.tensor_types.items() if not name.endswith((".bias", "_norm.weight"))
                and kind not in ("F32",)}


def kv_bytes_per_token(layers: int, kv_heads: int, key_length: int, value_length: int,
                       cache_type: str = DEFAULT_CACHE_TYPE) -> int:
    """llama.cpp's K and V cache bytes for one token of one sequence."""
    return int(layers * kv_heads * (key_length + value_length) * CACHE_TYPE_BYTES[cache_type])


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_gguf(path: Path) -> GgufFacts:
    """The facts of `path` (memory-mapped: no tensor data is read)."""
    gguf = gguf_module()
    reader = gguf.GGUFReader(str(path), "r")
    arch = str(_field(reader, "general.architecture"))

    def number(key: str, default: int | None = None) -> int:
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            if default is None:
                raise ValueError(f"{path.name}: GGUF metadata has no {arch}.{key}")
            return default
        return int(value)

    heads = number("attention.head_count")
    embedding = number("embedding_length")
    head_dim = embedding // heads
    types = list(_field(reader, "tokenizer.ggml.token_type") or [])
    bos, eos = _field(reader, "tokenizer.ggml.bos_token_id"), _field(reader, "tokenizer.ggml.eos_token_id")
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token")
    template = _field(reader, "tokenizer.chat_template")
    return GgufFacts(
        architecture=arch, file_type=int(_field(reader, "general.file_type") or 0),
        block_count=number("block_count"), embedding_length=embedding, head_count=heads,
        head_count_kv=number("attention.head_count_kv", heads),
        key_length=number("attention.key_length", head_dim), value_length=number("attention.value_length", head_dim),
        context_length=number("context_length"), vocab_size=len(types),
        bos_token_id=None if bos is None else int(bos), eos_token_id=None if eos is None else int(eos),
        add_bos_token=bool(add_bos), control_token_ids=frozenset(
            i for i, kind in enumerate(types) if int(kind) == int(gguf.TokenType.CONTROL)),
        chat_template=None if template is None else str(template),
        weights_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        tensor_types={str(t.name): t.tensor_type.name for t in reader.tensors},
    )
