"""Benchmark: convert (onnxruntime-genai builder) per precision, and validate against the fp32 build.

A synthetic Llama-shaped checkpoint (random weights, a BPE tokenizer trained on a small corpus) is written
with transformers; the weights are random, so only times and sizes mean something here, not the quality
metrics (tests/test_validate.py measures those on the trained tiny model). For each precision:
  convert   release.stages.convert.convert: wall time, output bytes, peak RSS of the builder subprocess
  validate  release.stages.validate.validate against the fp32 build on --prompts prompts: wall time
Results go to benchmarks/results/convert.json with the load average (the machine may be shared).

    python benchmarks/convert.py                          # hidden 512, 4 layers, vocab 8000 (~30M params)
    python benchmarks/convert.py --hidden 1024 --layers 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "convert.json"
PRECISIONS = (("fp32", "cpu"), ("fp16", "cuda"), ("int8", "cpu"), ("int4", "cpu"))
WORDS = ("the", "a", "model", "serves", "tokens", "fast", "slow", "cache", "memory", "replica", "rollout",
         "gate", "canary", "quality")


def write_checkpoint(folder: Path, hidden: int, layers: int, vocab: int) -> int:
    """A random-weight Llama checkpoint with a real tokenizer; returns its parameter count."""
    import random

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(500)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=min(vocab, 1000), special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
                            ).save_pretrained(str(folder))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4 // 32 * 32,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(folder))
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": c[:60]}) + "\n" for c in corpus))
    return sum(p.numel() for p in model.parameters())


def child_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run(hidden: int, layers: int, vocab: int, n_prompts: int) -> dict[str, Any]:
    from release.config import ValidationConfig
    from release.stages.convert import convert
    from release.stages.validate import load_prompts, validate

    with tempfile.TemporaryDirectory(prefix="relctl-bench-convert-") as tmp:
        root = Path(tmp)
        params = write_checkpoint(root / "checkpoint", hidden, layers, vocab)
        prompts = load_prompts(root / "checkpoint" / "prompts.jsonl")[:n_prompts]
        rows: list[dict[str, Any]] = []
        for precision, provider in PRECISIONS:
            result = convert(root / "checkpoint", root / precision, precision, execution_provider=provider)  # type: ignore[arg-type]
            rows.append({
                "precision": precision, "execution_provider": provider,
                "convert_wall_s": round(result.wall_time_s, 2), "output_bytes": result.total_bytes,
                "model_onnx_data_bytes": result.files.get("model.onnx.data", 0),
                "children_peak_rss_mb_so_far": round(child_peak_rss_mb(), 1),
                "tokenizer_parity": result.tokenizer_parity,
            })
        for row in rows[1:]:
            started = time.perf_counter()
            report = validate(root / "fp32", root / row["precision"], prompts,
                              root / "checkpoint" / "tokenizer.json", ValidationConfig())
            row["validate_wall_s"] = round(time.perf_counter() - started, 2)
            row["validate_positions"] = report.details.get("positions")
        return {
            "model": {"hidden": hidden, "layers": layers, "vocab": vocab, "parameters": params,
                      "safetensors_bytes": (root / "checkpoint" / "model.safetensors").stat().st_size},
            "prompts": len(prompts), "rows": rows,
            "host": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "python": platform.python_version()},
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    result = run(args.hidden, args.layers, args.vocab, args.prompts)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
