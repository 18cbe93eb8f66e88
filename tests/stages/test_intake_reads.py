"""Intake reads the weights once after fetching them: the NaN scan hashes each file in the same pass, and
the lineage and the stage manifest reuse those digests (counted with the kernel's read-byte counter)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from release.core.hashing import sha256_file
from release.core.numerics import scan_weights
from release.core.progress import Progress
from release.pipeline.runner import Pipeline
from release.registry import Registry
from release.registry.store import connect, ensure_experiment, resolve_store
from release.stages.intake import IntakeInputs, IntakeStage


def bytes_read() -> int:
    """Bytes this process has read through read(2)-like calls so far (/proc/self/io rchar)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def big_checkpoint(tiny_checkpoint: Path, out: Path) -> Path:
    """The tiny example's config and tokenizer with ~25 MB of weights (enough to dwarf incidental reads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny_checkpoint / name).is_file():
            shutil.copy(tiny_checkpoint / name, out / name)
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=config["vocab_size"], hidden_size=256, intermediate_size=1024,
                                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2))
    model.save_pretrained(out, safe_serialization=True)
    return out


def test_scan_hashes_in_the_same_read(tmp_path: Path, tiny_checkpoint: Path) -> None:
    ckpt = big_checkpoint(tiny_checkpoint, tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    size = weights.stat().st_size
    before = bytes_read()
    max_abs = scan_weights([weights])
    scanned = bytes_read() - before
    assert size <= scanned < size * 1.1 and max_abs
    before = bytes_read()
    digest = sha256_file(weights)
    assert bytes_read() - before < 1 << 20  # remembered: no second read
    assert digest == hashlib.sha256(weights.read_bytes()).hexdigest()
    # A changed file is read again (its change stamps moved), never served a stale digest.
    raw = bytearray(weights.read_bytes())
    raw[-4:] = np.float32(1.5).tobytes()
    weights.write_bytes(bytes(raw))
    assert sha256_file(weights) == hashlib.sha256(bytes(raw)).hexdigest() != digest


def test_intake_reads_the_weights_once_after_the_fetch(tmp_path: Path, tiny_checkpoint: Path) -> None:
    import mlflow

    ckpt = big_checkpoint(tiny_checkpoint, tmp_path / "ckpt")
    size = (ckpt / "model.safetensors").stat().st_size
    project = tmp_path / "project"
    project.mkdir()
    store = resolve_store(project)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, "reads")) as run:
        mlflow.log_artifacts(str(ckpt), "checkpoint")
    pipe = Pipeline(tmp_path / "work", Progress(quiet=True))
    before = bytes_read()
    done = pipe.run(IntakeStage(IntakeInputs(run_id=run.info.run_id), Registry(store)))
    read = bytes_read() - before
    # The fetch (a copy out of the artifact store) and one scan; the lineage hashes and the manifest's
    # checksums of the same file come from that scan (they used to be two more full reads).
    assert read < 2.5 * size, f"intake read {read / size:.2f}x the weights"
    assert done.result.lineage["checkpoint"]["weights_sha256"]["model.safetensors"] == \
        hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
