"""Benchmark: relctl's streaming LoRA merge against peft's merge_and_unload, and against the disk itself.

For each size, a synthetic Llama-shaped bf16 checkpoint (TinyLlama's shapes; sharded) and a LoRA adapter
(r=16 on q, k, v, o, gate, up, down) are written with safetensors. Then, each in a fresh subprocess and
with the inputs evicted from the page cache first:
  disk floor  copy the shards (read + write the same bytes) and fsync them
  relctl      release.stages.merge.merge_checkpoint (fsyncs its output)
  peft        AutoModelForCausalLM.from_pretrained + PeftModel.from_pretrained + merge_and_unload +
              save_pretrained, the way a user does it; the os.sync() after it is timed separately
and the two merged checkpoints are compared tensor by tensor. Wall time (with and without imports) and
peak RSS (ru_maxrss of the child) are written to benchmarks/results/merge.json and printed, with how
much of the inputs was still cached (fincore) and the load average, since the machine may be shared.
Inputs are evicted with posix_fadvise(DONTNEED); --drop-caches also drops the whole page cache. The
temp files are removed.

    python benchmarks/merge.py                  # 0.5 GB and 2.2 GB
    python benchmarks/merge.py --layers 3       # one size only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB, RANK = 2048, 5632, 32, 4, 32000, 16
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHARD_BYTES = 512 * 1024 * 1024
RESULTS = Path(__file__).parent / "results" / "merge.json"


# ---- children: each runs in a fresh interpreter and prints one JSON line ----

def child_generate(base: Path, adapter: Path, layers: int) -> dict[str, Any]:
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=layers,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, tie_word_embeddings=False,
                dtype="bfloat16").save_pretrained(base)
    gen = torch.Generator().manual_seed(0)
    shapes = _llama_shapes(layers)
    shard: dict[str, Any] = {}
    shards: list[dict[str, Any]] = []
    for name, shape in shapes.items():
        mean = 1.0 if name.endswith("norm.weight") else 0.0
        shard[name] = torch.empty(shape, dtype=torch.bfloat16).normal_(mean, 0.02, generator=gen)
        if sum(t.nbytes for t in shard.values()) >= SHARD_BYTES:
            shards.append(shard)
            shard = {}
    shards.append(shard)
    weight_map = {}
    for i, tensors in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, base / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in tensors})
    total = sum(t.nbytes for s in shards for t in s.values())
    (base / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    lora: dict[str, Any] = {}
    for name, shape in shapes.items():
        if name.split(".")[-2] in PROJECTIONS:
            out_dim, in_dim = shape
            module = "base_model.model." + name.removesuffix(".weight")
            lora[f"{module}.lora_A.weight"] = torch.randn(RANK, in_dim, generator=gen) / in_dim ** 0.5
            lora[f"{module}.lora_B.weight"] = torch.randn(out_dim, RANK, generator=gen) * 0.01
    save_file(lora, adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(PROJECTIONS),
               task_type="CAUSAL_LM").save_pretrained(str(adapter))
    return {"base_bytes": _size(base, "*.safetensors"), "adapter_bytes": _size(adapter, "*.safetensors"),
            "shards": len(shards), "tensors": len(shapes), "lora_modules": len(lora) // 2}


def _llama_shapes(layers: int) -> dict[str, tuple[int, ...]]:
    kv = HIDDEN // HEADS * KV_HEADS
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes.update({
            f"{p}.input_layernorm.weight": (HIDDEN,), f"{p}.post_attention_layernorm.weight": (HIDDEN,),
            f"{p}.self_attn.q_proj.weight": (HIDDEN, HIDDEN), f"{p}.self_attn.k_proj.weight": (kv, HIDDEN),
            f"{p}.self_attn.v_proj.weight": (kv, HIDDEN), f"{p}.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            f"{p}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN), f"{p}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{p}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        })
    shapes.update({"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)})
    return shapes


def child_floor(base: Path, out: Path) -> dict[str, Any]:
    out.mkdir()
    start = time.perf_counter()
    for src in sorted(base.glob("*.safetensors")):
        shutil.copyfile(src, out / src.name)
        fd = os.open(out / src.name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return {"wall_s": time.perf_counter() - start}


def child_relctl(base: Path, adapter: Path, out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    import torch  # noqa: F401  (merge_checkpoint imports it lazily; timed apart from the merge here)

    from release.stages.merge import merge_checkpoint

    imported = time.perf_counter()
    report = merge_checkpoint(base, adapter, out)
    done = time.perf_counter()
    return {"import_s": imported - start, "merge_s": done - imported, "wall_s": done - start,
            "report": report.model_dump()}


def child_peft(base: Path, adapter: Path, out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    imported = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(model, adapter)
    loaded = time.perf_counter()
    merged = model.merge_and_unload()
    merged_at = time.perf_counter()
    merged.save_pretrained(out)
    saved = time.perf_counter()
    os.sync()
    synced = time.perf_counter()
    return {"import_s": imported - start, "load_s": loaded - imported, "merge_s": merged_at - loaded,
            "save_s": saved - merged_at, "sync_s": synced - saved, "wall_s": saved - start,
            "work_s": saved - imported, "wall_with_sync_s": synced - start}


def child_compare(ours: Path, theirs: Path) -> dict[str, Any]:
    import torch
    from safetensors import safe_open

    def locate(folder: Path) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for path in folder.glob("*.safetensors"):
            with safe_open(path, "pt") as f:
                found.update(dict.fromkeys(f.keys(), path))
        return found

    mine, peft = locate(ours), locate(theirs)
    identical = 0
    for name, path in mine.items():
        with safe_open(path, "pt") as a, safe_open(peft[name], "pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
            identical += int(x.dtype == y.dtype and torch.equal(x.view(torch.int16), y.view(torch.int16)))
    return {"tensors": len(mine), "identical_tensors": identical, "peft_tensors": len(peft),
            "identical": identical == len(mine) == len(peft)}


CHILDREN = {"generate": child_generate, "floor": child_floor, "relctl": child_relctl, "peft": child_peft,
            "compare": child_compare}


def run_child(kind: str, *args: Any) -> dict[str, Any]:
    """Run one step in a fresh interpreter; its own peak RSS comes back with its JSON line."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "TQDM_DISABLE": "1"}, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = round(time.perf_counter() - started, 3)
    return result


def evict(folders: list[Path], drop_caches: bool) -> dict[str, Any]:
    """Make the next read come from disk, and measure how much of the inputs is still cached."""
    os.sync()
    method = "posix_fadvise(DONTNEED) on every input file after os.sync()"
    if drop_caches:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            method = "echo 3 > /proc/sys/vm/drop_caches"
        except OSError as exc:
            method += f" (drop_caches refused: {exc.strerror})"
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return {"method": method, "input_bytes_still_cached": _cached_bytes(files), "loadavg_1m": os.getloadavg()[0]}


def _cached_bytes(files: list[Path]) -> int | None:
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--json", "--bytes", *map(str, files)], capture_output=True, text=True,
                         check=False)
    return sum(int(row["res"]) for row in json.loads(out.stdout)["fincore"]) if out.returncode == 0 else None


def bench_size(work: Path, layers: int, with_peft: bool, drop_caches: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"merge-{layers}L-", dir=work))
    try:
        base, adapter = root / "base", root / "adapter"
        base.mkdir()
        adapter.mkdir()
        gen = run_child("generate", base, adapter, layers)
        gb = gen["base_bytes"] / 1e9
        row: dict[str, Any] = {"layers": layers, "base_gb": round(gb, 3), "base_bytes": gen["base_bytes"],
                               "adapter_bytes": gen["adapter_bytes"], "shards": gen["shards"],
                               "tensors": gen["tensors"], "lora_modules": gen["lora_modules"],
                               "generate_s": gen["process_wall_s"]}
        inputs = [base, adapter]
        cache = evict(inputs, drop_caches)
        floor = run_child("floor", base, root / "floor")
        shutil.rmtree(root / "floor")
        row["disk_floor"] = {**_timing(floor, gb), "cache": cache}
        cache = evict(inputs, drop_caches)
        relctl = run_child("relctl", base, adapter, root / "relctl")
        row["relctl"] = {**_timing(relctl, gb), "import_s": round(relctl["import_s"], 3),
                         "merge_s": round(relctl["merge_s"], 3),
                         "tensors_changed": relctl["report"]["tensors_changed"],
                         "largest_tensor_mb": round(relctl["report"]["largest_tensor_bytes"] / 1e6, 1),
                         "cache": cache}
        row["relctl_merge_over_floor"] = round(relctl["merge_s"] / floor["wall_s"], 2)
        if with_peft:
            cache = evict(inputs, drop_caches)
            peft = run_child("peft", base, adapter, root / "peft")
            row["peft"] = {**_timing(peft, gb), **{k: round(v, 3) for k, v in peft.items() if k.endswith("_s")},
                           "cache": cache}
            row["peft_over_relctl_wall"] = round(peft["wall_s"] / relctl["wall_s"], 2)
            row["peft_work_over_relctl_merge"] = round(peft["work_s"] / relctl["merge_s"], 2)
            row["bit_identical"] = run_child("compare", root / "relctl", root / "peft")
        return row
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _timing(result: dict[str, Any], gb: float) -> dict[str, Any]:
    return {"wall_s": round(result["wall_s"], 3), "gb_per_s": round(gb / result["wall_s"], 3),
            "peak_rss_mb": round(result["maxrss_kb"] / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 22],
                        help="decoder layers per size (3: 0.5 GB, 22: 2.2 GB, TinyLlama's shapes)")
    parser.add_argument("--no-peft", action="store_true", help="time relctl and the disk floor only")
    parser.add_argument("--drop-caches", action="store_true",
                        help="also drop the whole page cache before each run (root; evicts the Python "
                             "libraries and everyone's files too, so imports become cold)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()), help="where temp files go")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    if args.child:
        kind, *paths = args.child
        fn: Any = CHILDREN[kind]
        params = [Path(p) for p in paths[:2]] + [int(p) if p.isdigit() else Path(p) for p in paths[2:]]
        result = fn(*params)
        result["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(result, default=str))
        return
    rows = [bench_size(args.workdir, layers, not args.no_peft, args.drop_caches) for layers in args.layers]
    results = {"benchmark": "merge", "machine": _machine(), "sizes": rows, "targets": _targets(rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def _targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    with_peft = [r for r in rows if "peft" in r]
    return {
        "relctl_faster_than_peft": all(r["relctl"]["wall_s"] < r["peft"]["wall_s"] for r in with_peft),
        "relctl_merge_faster_than_peft_load_merge_save": all(r["relctl"]["merge_s"] < r["peft"]["work_s"]
                                                              for r in with_peft),
        "relctl_peak_rss_under_400mb": all(r["relctl"]["peak_rss_mb"] < 400 for r in rows),
        "bit_identical_to_peft": all(r["bit_identical"]["identical"] for r in with_peft),
    }


def _machine() -> dict[str, Any]:
    import psutil
    import torch

    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
            "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "platform": platform.platform()}


def _size(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern))


if __name__ == "__main__":
    main()
