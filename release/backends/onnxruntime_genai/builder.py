"""Building an onnxruntime-genai folder: the model builder in its own process (build_process.py: the
builder's own command line, quantizing one weight at a time, its peak memory reported), then the
tokenizer files aligned with the training tokenizer and checked for parity.

The builder's noisy output goes to the log file the convert stage names (beside the folder, not inside it:
the folder is what gets packaged and hashed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from release.backends.onnxruntime_genai.build_process import PEAK_MARKER
from release.backends.onnxruntime_genai.families import builder_config
from release.backends.onnxruntime_genai.model import GenaiModel
from release.backends.onnxruntime_genai.quantizers import builder_arguments, installed_options
from release.backends.variants import parse_variant
from release.core.checkpoint import read_config
from release.core.errors import InputError, StageFailed
from release.core.faults import pause_point
from release.core.subprocs import start_child, stop_child
from release.core.tokenizer_parity import EDGE_STRINGS, compare_tokenizers


def run_builder(model_dir: Path, out: Path, precision: str, execution_provider: str, log_path: Path) -> int | None:
    """Run the model builder in a subprocess (isolates its memory and its prints) into `out`; its peak RSS
    in bytes (None when it did not say). `precision` may be a variant (release/backends/variants.py): its
    options become the installed builder's own quantizer options (quantizers.py)."""
    cache = out.with_name(out.name + ".cache")
    shutil.rmtree(cache, ignore_errors=True)
    source = builder_input(model_dir, out.with_name(out.name + ".input"))
    variant = parse_variant(precision)
    cmd = [
        sys.executable, "-m", "release.backends.onnxruntime_genai.build_process",
        "-i", str(source), "-o", str(out), "-p", variant.precision, "-e", execution_provider, "-c", str(cache),
        *builder_arguments(variant, installed_options()),
    ]
    try:
        with log_path.open("w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            # Its own process group, and it dies with relctl (even a SIGKILLed one): no orphan builder.
            proc = start_child(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                pause_point("convert:builder-running")
                proc.wait()
            except BaseException:
                stop_child(proc, timeout_s=10)
                raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if source != model_dir:
            shutil.rmtree(source, ignore_errors=True)
    if proc.returncode != 0 or not (out / "model.onnx").is_file() or not (out / "genai_config.json").is_file():
        raise StageFailed(
            f"convert: onnxruntime-genai's model builder failed (exit {proc.returncode}): {last_line(log_path)}",
            hint=f"see the full builder log in {log_path}",
        )
    return builder_peak(log_path)


def builder_peak(log_path: Path) -> int | None:
    """The peak RSS build_process reported on its last line."""
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith(PEAK_MARKER):
            return int(line.split()[1])
    return None


def builder_input(model_dir: Path, shadow: Path) -> Path:
    """The folder the builder reads: `model_dir`, or `shadow` (links to its files) with config.json restated
    by families.builder_config when the builder would misread the original."""
    config = read_config(model_dir)
    restated = builder_config(config)
    if restated == config:
        return model_dir
    shutil.rmtree(shadow, ignore_errors=True)
    shadow.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name != "config.json":
            (shadow / path.name).symlink_to(path.resolve())
    (shadow / "config.json").write_text(json.dumps(restated, indent=2) + "\n")
    return shadow


def align_tokenizer(model_dir: Path, out: Path) -> list[str]:
    """Make the served tokenizer files the training ones, with BOS/EOS settings stated explicitly.

    The training tokenizer.json is copied byte for byte (the post-processor that adds BOS lives there).
    tokenizer_config.json gets bos_token/eos_token and add_bos_token/add_eos_token derived from what
    tokenizers' post-processor really adds, because onnxruntime-extensions looks the BOS id up by the
    bos_token string in that file. Returns notes on what changed.
    """
    from release.core.jsonfile import load_json_object  # noqa: PLC0415
    from release.core.tokenizer_file import load_tokenizer  # noqa: PLC0415 - the Rust extension, when aligning

    source = model_dir / "tokenizer.json"
    if not source.is_file():
        raise InputError(
            f"{model_dir.name}: tokenizer.json is missing",
            hint="save the fast tokenizer with the checkpoint (tokenizer.save_pretrained(dir))",
        )
    shutil.copy2(source, out / "tokenizer.json")
    training = load_tokenizer(source)
    bos, eos = added_specials(training)
    cfg_path = out / "tokenizer_config.json"
    cfg = load_json_object(cfg_path, "save the tokenizer with tokenizer.save_pretrained(dir)",
                           f"{model_dir.name}/tokenizer_config.json", missing_ok=True)
    wanted: dict[str, Any] = {"add_bos_token": bos is not None, "add_eos_token": eos is not None}
    if bos is not None:
        wanted["bos_token"] = bos
    if eos is not None:
        wanted["eos_token"] = eos
    wanted.setdefault("tokenizer_class", cfg.get("tokenizer_class") or "PreTrainedTokenizerFast")
    notes = [f"tokenizer_config.json: {k} {cfg.get(k)!r} -> {v!r}" for k, v in wanted.items() if cfg.get(k) != v]
    cfg.update(wanted)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    return notes


def added_specials(tokenizer: Any) -> tuple[str | None, str | None]:
    """The special tokens the post-processor puts before and after a text (BOS, EOS), if any."""
    sample = tokenizer.encode("a")
    mask = list(sample.special_tokens_mask)
    if 0 not in mask:
        return None, None
    first, last = mask.index(0), len(mask) - 1 - mask[::-1].index(0)
    bos = sample.tokens[0] if first > 0 else None
    eos = sample.tokens[-1] if last < len(mask) - 1 else None
    return bos, eos


def check_tokenizer_parity(model_dir: Path, out: Path) -> bool:
    """Whether the converted folder's served tokenizer encodes the probes exactly like the training one."""
    encode = GenaiModel.served_tokenizer(out)
    return compare_tokenizers(encode, model_dir / "tokenizer.json", list(EDGE_STRINGS)).passed


def last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.startswith(PEAK_MARKER)]
    return lines[-1][-300:] if lines else "(empty log)"
