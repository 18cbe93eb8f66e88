"""Merge: fold a PEFT LoRA adapter into its base checkpoint, streaming, bit-identical to peft.

`merge_checkpoint(base, adapter, out)` writes a full Hugging Face checkpoint of the merged model: the
base's sharding, dtypes and tensor order, its index (if sharded), config.json, generation_config.json
and the tokenizer files, and no adapter files. Everything is checked from headers before writing; the
output is built in a hidden sibling folder and renamed into place only when complete and fsynced.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from release.core.checkpoint import (
    SafetensorsHeader,
    check_index,
    read_config,
    read_header,
    refuse_pickles,
    weight_files,
)
from release.core.errors import InputError, StageFailed
from release.core.faults import pause_point
from release.core.jsonfile import load_json_object, optional
from release.core.numerics import tensor_max_abs
from release.lora.adapter import ADAPTER_FILE, AdapterPlan, BaseIndex, plan_adapter
from release.lora.base_name import ADAPTER_KEY, BASE_NAME_HINT, check_base_names
from release.lora.settings import read_settings
from release.stages.base import Stage, StageInputs, StageResult, location, output_folder

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json", "vocab.txt", "merges.txt",
    "chat_template.jinja", "chat_template.json",
)
MergeProgress = Callable[[int, int], None]


def merge_checkpoint(base_dir: Path, adapter_dir: Path, out_dir: Path,
                     progress: MergeProgress | None = None) -> MergeResult:
    """Fold the LoRA adapter in `adapter_dir` into the checkpoint in `base_dir`; write it to `out_dir`.

    `adapter_dir` may be `base_dir` itself. `progress(bytes_done, bytes_total)` is called as the weight
    files are written. Raises InputError (nothing written) for anything that cannot merge exactly.
    """
    started = time.monotonic()
    headers, plan, settings_base, name_warning = _check_inputs(base_dir, adapter_dir)
    _check_out_dir(out_dir, sum(h.path.stat().st_size for h in headers))
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        changed = _write_shards(headers, plan, adapter_dir / ADAPTER_FILE, tmp, progress)
        tokenizer_from = _copy_side_files(base_dir, adapter_dir, tmp)
        _write_index(base_dir, headers, tmp)
        _fsync(tmp)
        if out_dir.is_dir():
            out_dir.rmdir()  # _check_out_dir allowed only an empty folder
        tmp.rename(out_dir)
        _fsync(out_dir.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = sorted(p for p in out_dir.iterdir() if p.is_file())
    return MergeResult(
        model=out_dir.name,
        lora_modules=len(plan.folds),
        dora_modules=sum(1 for m in plan.folds.values() if m.magnitude is not None),
        replaced_tensors=len(plan.replacements),
        tensors_changed=changed,
        tensors_written=sum(len(h.tensors) for h in headers),
        bytes_written=sum(p.stat().st_size for p in files),
        output_files=[p.name for p in files],
        largest_tensor_bytes=max((i.nbytes for h in headers for n, i in h.tensors.items() if plan.touches(n)),
                                 default=0),
        seconds=round(time.monotonic() - started, 3),
        base_model_name_or_path=settings_base,
        tokenizer_from=tokenizer_from,
        notes=_notes(plan) + ([name_warning] if name_warning else []),
    )


def _check_inputs(base_dir: Path, adapter_dir: Path
                  ) -> tuple[list[SafetensorsHeader], AdapterPlan, str | None, str | None]:
    for folder in {base_dir, adapter_dir}:
        if not folder.is_dir():
            raise InputError(f"{folder}: not a folder", hint="pass the checkpoint folder (config.json + *.safetensors)")
        refuse_pickles(folder)
    base_config = read_config(base_dir)
    settings = read_settings(adapter_dir)
    names = check_base_names({ADAPTER_KEY: settings.base_model_name_or_path}, base_config)
    if names.error:
        raise InputError(names.error, hint=BASE_NAME_HINT)
    headers = [read_header(p) for p in weight_files(base_dir)]
    check_index(base_dir, {h.path: h for h in headers})
    plan = plan_adapter(adapter_dir, settings, _index_base(headers))
    # A NaN or Inf in the adapter spreads over every weight it folds into; the adapter is small to scan.
    tensor_max_abs([adapter_dir / ADAPTER_FILE])
    return headers, plan, settings.base_model_name_or_path, names.warning


def _index_base(headers: list[SafetensorsHeader]) -> BaseIndex:
    base: BaseIndex = {}
    for header in headers:
        for name, info in header.tensors.items():
            if name in base:
                raise InputError(f"{header.path.name}: tensor '{name}' is also in {base[name][0].name}",
                                 hint="re-save the checkpoint; each tensor must live in exactly one shard")
            base[name] = (header.path, info)
    return base


def _check_out_dir(out_dir: Path, needed: int) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise InputError(f"{out_dir}: already exists and is not an empty folder",
                         hint="choose a new output folder or remove the old one")
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < needed:
        raise StageFailed(f"{parent}: {needed / 1e9:.2f} GB needed for the merged checkpoint, {free / 1e9:.2f} GB free",
                          hint="free disk space or write the merged checkpoint elsewhere")


def _write_shards(headers: list[SafetensorsHeader], plan: AdapterPlan, adapter_file: Path, out: Path,
                  progress: MergeProgress | None) -> int:
    # torch is imported here, not at module import, so `relctl --help` and the other stages stay fast.
    import torch  # noqa: PLC0415 - torch (the models extra) is heavy and optional; only when this path runs

    from release.lora.shards import write_merged_shard  # noqa: PLC0415 - lazy: release is heavy
    from release.lora.workspace import Workspace  # noqa: PLC0415 - lazy: release is heavy

    total = sum(h.path.stat().st_size for h in headers)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        pause_point("merge:writing")
        if progress is not None:
            progress(done, total)

    changed = 0
    workspace = Workspace()
    adapter_fd = os.open(adapter_file, os.O_RDONLY)
    # The folds are memory-bound and run beside a writer thread; a second OpenMP thread gains little
    # and, on a busy machine, its spin-waits made the merge 5x slower (benchmarks/merge.py).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for header in headers:
            changed += write_merged_shard(header, out / header.path.name, plan, adapter_fd, workspace, advance)
    finally:
        torch.set_num_threads(threads)
        os.close(adapter_fd)
    return changed


def _copy_side_files(base_dir: Path, adapter_dir: Path, out: Path) -> str | None:
    """Copy config and tokenizer files; return where the tokenizer came from.

    The tokenizer saved next to the adapter wins over the base's: it is the one training used (added
    special tokens, chat template). The two sets are never mixed.
    """
    for name in CONFIG_FILES:
        if (base_dir / name).is_file():
            _copy_synced(base_dir / name, out / name)
    for folder, label in ((adapter_dir, "adapter"), (base_dir, "base")):
        names = [n for n in TOKENIZER_FILES if (folder / n).is_file()]
        if names:
            for name in names:
                _copy_synced(folder / name, out / name)
            return label if adapter_dir != base_dir else "base"
    return None


def _copy_synced(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    _fsync(dst)


def _write_index(base_dir: Path, headers: list[SafetensorsHeader], out: Path) -> None:
    source = base_dir / INDEX_FILE
    if not source.is_file():
        return
    label = f"{base_dir.name}/{INDEX_FILE}"
    metadata = optional(load_json_object(source, "re-save the sharded checkpoint", label), "metadata", dict, label,
                        "re-save the sharded checkpoint") or {}
    weight_map = {name: h.path.name for h in headers for name in h.tensors}
    metadata = {**metadata, "total_size": sum(i.nbytes for h in headers for i in h.tensors.values())}
    (out / INDEX_FILE).write_text(json.dumps({"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))},
                                             indent=2) + "\n")
    _fsync(out / INDEX_FILE)


def _fsync(path: Path) -> None:
    """Flush a file or a folder entry, so the rename publishes complete, durable files."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _notes(plan: AdapterPlan) -> list[str]:
    notes = [("adapter math in fp32 (fp64 for fp64 weights), as PeftModel.from_pretrained's default "
              "autocast_adapter_dtype=True does")]
    if plan.replacements:
        names = sorted(plan.replacements)
        notes.append(f"base tensors replaced by the adapter's trained copies: {', '.join(names[:5])}"
                     + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
    return notes


class MergeInputs(StageInputs):
    upstream: str = Field(description="fingerprint of the stage that produced the checkpoint")
    base: Path = location()
    adapter: Path = location()
    # The merged checkpoint's folder inside the stage folder ("" = the stage folder itself).
    into: str = "model"


class MergeResult(StageResult):
    """What a merge wrote. `largest_tensor_bytes` bounds the tensor data held in memory at once."""

    model: str
    lora_modules: int
    dora_modules: int
    tensors_changed: int
    bytes_written: int
    notes: list[str]
    replaced_tensors: int = 0
    tensors_written: int = 0
    output_files: list[str] = Field(default_factory=list)
    largest_tensor_bytes: int = 0
    seconds: float = 0.0
    base_model_name_or_path: str | None = None
    tokenizer_from: str | None = None


class MergeStage(Stage[MergeInputs, MergeResult]):
    """Fold the PEFT LoRA adapter into the base checkpoint, exactly as peft's merge_and_unload."""

    name = "merge"
    result_type = MergeResult

    def run(self, out: Path) -> MergeResult:
        target = output_folder(out, self.inputs.into)
        result = merge_checkpoint(self.inputs.base, self.inputs.adapter, target)
        return result.model_copy(update={"model": self.inputs.into})  # relative to the stage folder

    def summary(self, result: MergeResult) -> str:
        return f"LoRA folded into the base ({result.lora_modules} modules)"
