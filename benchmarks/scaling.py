"""Benchmark: what one `relctl promote` costs a release runner as the model grows (time, peak RSS, disk).

Synthetic Qwen2.5-shaped checkpoints (the published 0.5B / 1.5B / 3B shapes: GQA, qkv biases, tied
embeddings, vocab 151,936, bf16 weights) with random weights and a small BPE tokenizer are logged as a
training run the way the README's run contract asks, then promoted by the real CLI at each precision
with no gates. The weights are random, so the validation metrics here are noise (a random model's int4
top-1 agreement means nothing): the thresholds are opened so every promote runs to the end, and this
benchmark measures time, memory and disk only (tests/families measures quality on trained checkpoints).

Per stage (attributed by the progress lines promote prints as each stage finishes):
  seconds         wall time of the stage
  peak_rss_bytes  the largest sum of RSS over relctl and every process it started (the builder, the
                  reference worker), sampled every 0.1 s from /proc through psutil
Every promote runs inside a real memory limit (tests/memlimit.py: a child group of the v1 cgroup memory
controller, page cache counted as a runner's limit counts it): int4/int8 0.6x the checkpoint + 1 GB,
fp16/bf16 1.0x + 1 GB, fp32 of a bf16 checkpoint 2.2x + 1 GB (issue 28's targets). A row records the
limit, the group's own peak (RSS + page cache, memory.max_usage_in_bytes), OOM kills and whether the
promote finished inside it (exit 0 or a quality verdict, never killed).
The whole promote: peak RSS (the same tree sum) against the checkpoint's bytes, disk at the end (all of
`.relctl/`, and what relctl wrote there: its work folder and the registered files, without the training
run's logged checkpoint; hard links counted once), and two floors measured on the same input:
  read_once_s     reading and hashing the checkpoint once (page cache warm: the promote's own reads are too)
  builder_alone   onnxruntime-genai's model builder run by hand on the checkpoint at that precision
                  (seconds and peak RSS): what convert cannot go below
and relctl's own disk at its peak during the promote (sampled every 2 s) against checkpoint + candidate.
Results: benchmarks/results/scaling.json (merged by size and precision across invocations).

    python benchmarks/scaling.py --sizes 0.5b --precisions int4,fp16
    python benchmarks/scaling.py --sizes 1.5b --precisions int4 --no-floors
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.memlimit import MemoryGroup  # noqa: E402 - the repository root is on the path first

GB = 1 << 30
# Memory limits by precision: (share of the checkpoint, bytes on top) (issue 28).
LIMITS = {"int4": (0.6, GB), "int8": (0.6, GB), "fp16": (1.0, GB), "bf16": (1.0, GB), "fp32": (2.2, GB)}


def provider(precision: str) -> str:
    """fp16 is a GPU precision for the builder: built for cuda (its graph still runs on ORT's CPU kernels)."""
    return "cuda" if precision == "fp16" else "cpu"


def limit_bytes(precision: str, ckpt_bytes: int) -> int:
    share, extra = LIMITS[precision]
    return int(share * ckpt_bytes + extra)
RESULTS = Path(__file__).parent / "results" / "scaling.json"
RELCTL = Path(sys.executable).parent / "relctl"
CACHE = Path(os.environ.get("RELCTL_SCALING_CACHE", "/tmp/relctl-scaling"))
# The published Qwen2.5 shapes (config.json of Qwen/Qwen2.5-0.5B, -1.5B, -3B).
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 256},  # a smoke test of the benchmark itself
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864},
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960},
    "3b": {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
           "intermediate_size": 11008},
}
VOCAB = 151936
WORDS = ("the", "a", "model", "serves", "tokens", "fast", "slow", "cache", "memory", "replica", "rollout",
         "gate", "canary", "quality", "release", "weights", "bytes", "stage", "runner", "disk")
PROMPTS = [f"{a} {b} {c} of the {d}" for a, b, c, d in zip(WORDS, WORDS[3:], WORDS[6:], WORDS[9:], strict=False)][:8]
STAGE_LINE = re.compile(r"^[✓↺✗]\s+(\S+)\s+([\d.]+)s")


def checkpoint(size: str, cache: Path = CACHE) -> Path:
    """The synthetic checkpoint of `size` (written once, then reused from the cache folder)."""
    out = cache / size / "checkpoint"
    if (out / "config.json").is_file():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tmp = out.with_name("checkpoint.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Byte-level BPE as Qwen's is (onnxruntime-extensions serves it with the same ids: tokenizer parity).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) for i in range(400)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="$A", special_tokens=[])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>").save_pretrained(tmp)
    eos = tok.token_to_id("<|endoftext|>")
    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=32768, rope_theta=1000000.0,
                         tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=eos, eos_token_id=eos,
                         **SHAPES[size])
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: the 1.5B never exists at fp32 here
    model = Qwen2ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(tmp, safe_serialization=True, max_shard_size="100GB")
    del model
    tmp.rename(out)
    return out


def weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def folder_bytes(folder: Path, skip: Path | None = None) -> int:
    """Bytes on disk under `folder` (a file with several hard links counted once), leaving out `skip`."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for p in folder.rglob("*"):
        if not p.is_file() or p.is_symlink() or (skip is not None and p.is_relative_to(skip)):
            continue
        stat = p.stat()
        if (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            total += stat.st_size
    return total


class TreeSampler:
    """Samples the summed RSS of a process and all its descendants every `interval` seconds (and, with
    `disk`, the bytes under that folder every 2 s)."""

    def __init__(self, pid: int, interval: float = 0.1, disk: tuple[Path, Path] | None = None) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.disk = disk
        self.disk_peak = 0
        self._disk_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            if total:
                self.samples.append((time.monotonic(), total))
            if self.disk is not None and time.monotonic() - self._disk_at > 2.0:
                self._disk_at = time.monotonic()
                try:
                    self.disk_peak = max(self.disk_peak, folder_bytes(*self.disk))
                except OSError:
                    pass  # a folder renamed or removed under the walk: the next sample counts it
            self._stop.wait(self.interval)

    def peak(self, start: float = 0.0, end: float = float("inf")) -> int:
        return max((rss for t, rss in self.samples if start <= t <= end), default=0)


def log_run(project: Path, ckpt: Path, data: Path) -> str:
    sys.path.insert(0, str(ROOT))
    import mlflow

    from release.registry.store import connect, ensure_experiment, resolve_store

    store = resolve_store(project)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, "scaling")) as run:
        mlflow.log_artifacts(str(ckpt), "checkpoint")
        mlflow.log_artifact(str(data / "prompts.jsonl"), "validation")
        return str(run.info.run_id)


def promote(size: str, precision: str, work: Path) -> dict[str, Any]:
    ckpt = checkpoint(size)
    project = work / f"{size}-{precision}"
    shutil.rmtree(project, ignore_errors=True)
    (project / "data").mkdir(parents=True)
    (project / "data" / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    # Random weights: every quality threshold opened (see the module docstring); the stages all run.
    (project / "release.yaml").write_text(
        f"model: scaling-{size}\nconvert:\n  precision: {precision}\n  execution_provider: {provider(precision)}\n"
        "validation:\n  min_top1_agreement: 0\n"
        "  max_mean_kl: 1000\n  max_perplexity_increase: 1000\n  min_greedy_agreement: 0\n")
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    run_id = log_run(project, ckpt, project / "data")
    # Every release is signed: the project's own key pair, as a new project makes it (not timed).
    subprocess.run([str(RELCTL), "--project-dir", str(project), "keygen", "--if-missing"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    ckpt_bytes = weights_bytes(ckpt)
    limit = limit_bytes(precision, ckpt_bytes)
    # What relctl itself writes: the work folder and the registered files, not the training run's logged
    # checkpoint (the input, in the same local artifact store here).
    own = (project / ".relctl", project / ".relctl" / "artifacts" / "scaling")
    started = time.monotonic()
    with MemoryGroup(limit) as group:
        proc = subprocess.Popen([str(RELCTL), "--project-dir", str(project), "promote", run_id, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                preexec_fn=group.enter)
        stages: list[dict[str, Any]] = []
        with TreeSampler(proc.pid, disk=own) as sampler:
            assert proc.stderr is not None
            last = started
            tail: list[str] = []
            for line in proc.stderr:
                sys.stderr.write(line)
                tail = [*tail[-5:], line.rstrip()]
                match = STAGE_LINE.match(line.strip())
                if match:
                    now = time.monotonic()
                    stages.append({"stage": match.group(1), "seconds": float(match.group(2)), "start": last,
                                   "end": now})
                    last = now
            out, _ = proc.communicate()
        group_peak, oom_kills = group.peak_bytes(), group.oom_kills()
    total = time.monotonic() - started
    for stage in stages:
        stage["peak_rss_bytes"] = sampler.peak(stage.pop("start"), stage.pop("end"))
    report = json.loads(out) if out.strip() else {}
    peak = sampler.peak()
    candidate = sum(folder_bytes(m) for m in (project / ".relctl" / "work").glob("*/convert-*/model"))
    relctl_disk = folder_bytes(*own)
    killed = oom_kills > 0 or proc.returncode in (-9, 137)
    return {"size": size, "precision": precision, "exit_code": proc.returncode, "outcome": report.get("outcome"),
            "checkpoint_bytes": ckpt_bytes, "total_s": round(total, 1), "peak_rss_bytes": peak,
            "peak_over_checkpoint": round(peak / ckpt_bytes, 2),
            "memory_limit": {"limit_bytes": limit, "rule": "{}x checkpoint + {} GB".format(*LIMITS[precision][:1],
                                                                                      LIMITS[precision][1] // GB),
                             "group_peak_bytes": group_peak, "oom_kills": oom_kills, "killed": killed,
                             "held": not killed and proc.returncode in (0, 1)},
            "error_tail": [] if proc.returncode == 0 else tail,
            "work_disk_bytes": folder_bytes(project / ".relctl"),
            "relctl_disk_bytes": relctl_disk,
            "relctl_disk_peak_bytes": max(sampler.disk_peak, relctl_disk),
            "candidate_bytes": candidate,
            "relctl_disk_peak_over_checkpoint_plus_candidate": round(
                max(sampler.disk_peak, relctl_disk) / (ckpt_bytes + candidate), 2) if candidate else None,
            "stages": stages}


def read_once_s(ckpt: Path) -> float:
    started = time.perf_counter()
    for path in ckpt.glob("*.safetensors"):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(8 << 20):
                digest.update(chunk)
    return round(time.perf_counter() - started, 2)


def builder_alone(ckpt: Path, precision: str, work: Path) -> dict[str, Any]:
    out = work / f"builder-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o",
                             str(out), "-p", precision, "-e", provider(precision), "-c", str(work / "builder-cache")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with TreeSampler(proc.pid) as sampler:
        proc.wait()
    result = {"exit_code": proc.returncode, "seconds": round(time.monotonic() - started, 1),
              "peak_rss_bytes": sampler.peak(), "output_bytes": folder_bytes(out)}
    shutil.rmtree(out, ignore_errors=True)
    return result


# Published parameter counts of the sizes the fit extrapolates to (bf16 checkpoints: 2 bytes a parameter).
TARGETS = {"8B": 8.03e9, "70B": 70.6e9}


def fit(rows: dict[str, Any], label: str = "after") -> dict[str, Any]:
    """Least-squares line through (checkpoint bytes, measure) per precision over the measured sizes, read at
    the TARGETS: peak RSS, work-folder disk and wall minutes a release runner needs (time on this 2-core
    machine under its measured load; a line, since every stage streams or runs the model once)."""
    out: dict[str, Any] = {}
    for precision in ("int4", "fp16", "fp32"):
        points = [r for k, r in rows.items() if k.startswith(f"{label}/") and r["precision"] == precision
                  and r["exit_code"] == 0 and r["size"] != "tiny"]
        if len({r["checkpoint_bytes"] for r in points}) < 2:
            continue
        x = [float(r["checkpoint_bytes"]) for r in points]
        line: dict[str, list[float]] = {}
        series = [("peak_rss_bytes", [float(r["peak_rss_bytes"]) for r in points]),
                  ("group_peak_bytes", [float(r.get("memory_limit", {}).get("group_peak_bytes", r["peak_rss_bytes"]))
                                        for r in points]),
                  ("work_disk_bytes", [float(r["work_disk_bytes"]) for r in points]),
                  ("minutes", [r["total_s"] / 60 for r in points])]
        if all("relctl_disk_bytes" in r for r in points):
            series.append(("relctl_disk_bytes", [float(r["relctl_disk_bytes"]) for r in points]))
        if all("relctl_disk_peak_bytes" in r for r in points):
            series.append(("relctl_disk_peak_bytes", [float(r["relctl_disk_peak_bytes"]) for r in points]))
        for key, values in series:
            n = len(x)
            mx, my = sum(x) / n, sum(values) / n
            slope = sum((a - mx) * (b - my) for a, b in zip(x, values, strict=True)) / sum((a - mx) ** 2 for a in x)
            line[key] = [slope, my - slope * mx]
        out[precision] = {name: {key: round(a * 2 * params + b, 1 if key == "minutes" else None)
                                 for key, (a, b) in line.items()} | {"checkpoint_bytes": int(2 * params)}
                          for name, params in TARGETS.items()}
        out[precision]["per_checkpoint_byte"] = {key: a for key, (a, _) in line.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5b", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--precisions", default="int4,fp16")
    parser.add_argument("--no-floors", action="store_true", help="skip the builder-alone floor (minutes at 1.5B)")
    parser.add_argument("--label", default="after", help="key the rows are stored under (before/after a change)")
    parser.add_argument("--work", type=Path, default=CACHE / "work")
    args = parser.parse_args()
    for size in args.sizes.split(","):
        ckpt = checkpoint(size)
        for precision in args.precisions.split(","):
            load_before = os.getloadavg()
            row = promote(size, precision, args.work)
            row["floors"] = {"read_once_s": read_once_s(ckpt)}
            if not args.no_floors:
                row["floors"]["builder_alone"] = builder_alone(ckpt, precision, args.work)
            else:  # the builder alone does not change with relctl: keep the one measured before, if any
                kept = json.loads(RESULTS.read_text()).get("rows", {}) if RESULTS.is_file() else {}
                # This label's own first, else the last other label's (named: another session, another load).
                labels = [args.label, *reversed([k.split("/")[0] for k in kept if k.split("/")[0] != args.label])]
                for label in labels:
                    earlier = kept.get(f"{label}/{size}/{precision}", {}).get("floors", {}).get("builder_alone")
                    if earlier is not None:
                        row["floors"]["builder_alone"] = {**earlier, "measured_under_label": label}
                        break
            row["loadavg"] = [load_before, os.getloadavg()]
            shutil.rmtree(args.work / f"{size}-{precision}", ignore_errors=True)
            print(json.dumps(row, indent=2))
            # Read again just before writing: another invocation (another size) may have written meanwhile.
            results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
            rows = results.setdefault("rows", {})
            rows[f"{args.label}/{size}/{precision}"] = row
            results["machine"] = {"cpus": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total}
            results["fit"] = fit(rows, args.label)
            results["fit_label"] = args.label
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
