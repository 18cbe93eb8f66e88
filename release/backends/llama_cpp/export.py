"""Checkpoint -> GGUF at one precision, with llama.cpp's own tools (the converter and llama-quantize).

fp16: the converter writes F16 directly. q8_0 and q4_K_M: the converter writes F32 (outside the package
folder) and llama-quantize quantizes it, as llama.cpp's own documentation does; norms stay F32 at every
precision (the converter's and llama-quantize's rule, not relctl's).

q4_K_M is a k-quant: llama-quantize stores a matrix as Q4_K/Q6_K only when its rows are a multiple of 256
wide (QK_K) and silently falls back to a legacy type (q5_0, q8_0, ...) otherwise. A package called q4_K_M
that holds q5_0 would misname itself, so such a checkpoint is refused (from config.json, before the
converter runs), and the built file's tensor types are checked again after quantizing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from release.backends.llama_cpp import toolchain
from release.backends.llama_cpp.gguf_facts import GGUF_FILE, K_QUANT_TYPES, read_gguf
from release.core.errors import InputError, StageFailed

# relctl precision -> (converter --outtype, llama-quantize type or None)
RECIPES: dict[str, tuple[str, str | None]] = {"fp16": ("f16", None), "q8_0": ("f32", "Q8_0"),
                                              "q4_K_M": ("f32", "Q4_K_M")}
K_QUANT_PRECISIONS = frozenset({"q4_K_M"})
QK_K = 256  # ggml's k-quant super-block: a k-quantized row's width must be a multiple of it
# llama.cpp's name of the pre-tokenizer that is exactly tokenizers' ByteLevel with GPT-2's regex.
GPT2_PRE = "gpt-2"


def matrix_widths(config: dict[str, Any]) -> dict[str, int]:
    """The row width (input dimension) of each kind of weight matrix of a Llama-style decoder."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    return {"hidden_size (q/k/v/gate/up projections, embeddings)": hidden,
            "num_attention_heads x head_dim (o_proj)": heads * head_dim,
            "intermediate_size (down_proj)": int(config["intermediate_size"])}


def k_quant_problem(config: dict[str, Any], precision: str) -> str | None:
    """Why `precision` (a k-quant) cannot be built as named from this config, or None."""
    if precision not in K_QUANT_PRECISIONS:
        return None
    narrow = {name: width for name, width in matrix_widths(config).items() if width % QK_K}
    if not narrow:
        return None
    listed = ", ".join(f"{name} {width}" for name, width in narrow.items())
    return (f"{precision} is a k-quant: its rows must be multiples of {QK_K} wide, and this model's are not "
            f"({listed}); llama-quantize would store them as q5_0/q8_0 instead, so the package would not be "
            f"{precision}")


def pre_tokenizer_of(tokenizer_json: Path) -> str:
    """llama.cpp's name for tokenizer.json's pre-tokenizer when relctl can tell it exactly, else "" (the
    converter's own hash table decides, and refuses what it does not know).

    Exactly GPT-2's: a BPE model with no normalizer and a lone ByteLevel pre-tokenizer that splits with its
    regex and adds no prefix space; llama.cpp's "gpt-2" pre-tokenizer is that regex over byte-level BPE."""
    if not tokenizer_json.is_file():
        return ""
    data = json.loads(tokenizer_json.read_text())
    pre = data.get("pre_tokenizer") or {}
    model = data.get("model") or {}
    exact = (model.get("type") == "BPE" and data.get("normalizer") is None and pre.get("type") == "ByteLevel"
             and pre.get("use_regex", True) and not pre.get("add_prefix_space", False))
    return GPT2_PRE if exact else ""


def _run(argv: list[str], log_path: Path, what: str) -> None:
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        last = next((line for line in reversed(lines) if "rror" in line), lines[-1] if lines else "(no output)")
        raise StageFailed(f"llama.cpp {what} exited with {done.returncode}: {last[:300]}",
                          hint=f"see {log_path}")


def export_gguf(checkpoint: Path, out: Path, precision: str, log_path: Path) -> list[str]:
    """Build `out`/model.gguf from `checkpoint`; the notes the convert stage records."""
    root = toolchain.require()
    config = json.loads((checkpoint / "config.json").read_text())
    problem = k_quant_problem(config, precision)
    if problem is not None:
        raise InputError(f"config.json: {problem}", hint="use q8_0 or fp16 for this model (the llama-cpp backend)")
    outtype, quant_type = RECIPES[precision]
    pre = pre_tokenizer_of(checkpoint / "tokenizer.json")
    log_path.write_text("")
    target = out / GGUF_FILE
    with tempfile.TemporaryDirectory(prefix="relctl-gguf-", dir=log_path.parent) as scratch:
        converted = target if quant_type is None else Path(scratch) / "model-f32.gguf"
        _run([sys.executable, str(Path(__file__).with_name("run_converter.py")), str(toolchain.converter_dir(root)),
              pre, str(checkpoint), "--outfile", str(converted), "--outtype", outtype], log_path, "convert_hf_to_gguf")
        if quant_type is not None:
            _run([str(root / "bin" / "llama-quantize"), str(converted), str(target), quant_type], log_path,
                 "llama-quantize")
    facts = read_gguf(target)
    types = facts.matrix_types()
    if precision in K_QUANT_PRECISIONS:
        legacy = sorted(name for name, kind in types.items() if kind not in K_QUANT_TYPES)
        if legacy:
            raise StageFailed(f"llama-quantize stored {len(legacy)} of {len(types)} matrices of a {precision} build "
                              f"in a legacy type (first: {legacy[0]} as {types[legacy[0]]})",
                              hint="use q8_0 or fp16 for this model")
    counts: dict[str, int] = {}
    for kind in types.values():
        counts[kind] = counts.get(kind, 0) + 1
    notes = [f"GGUF {precision}: " + ", ".join(f"{n} x {kind}" for kind, n in sorted(counts.items()))
             + f" (norms F32); {facts.weights_bytes:,} bytes of tensors"]
    if pre:
        notes.append(f"pre-tokenizer '{pre}' read from tokenizer.json (used only if the converter's hash table "
                     "does not know it; validation's tokenizer parity checks it)")
    return notes
