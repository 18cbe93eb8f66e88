"""Write one merged shard: the base shard's bytes, with the tensors the adapter changes recomputed.

A merge never changes a tensor's name, dtype or shape, so the output shard keeps the base shard's header
byte for byte and every tensor at the same offset. Untouched ranges are copied by the kernel; each
touched tensor is read, folded and written on its own, so memory holds two base tensors (the one being
folded, the one being written) and one's adapter pieces at a time, whatever the size of the model.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from release.core.checkpoint import SafetensorsHeader, TensorInfo
from release.lora import fold
from release.lora.adapter import AdapterPlan, LoraModule
from release.lora.tensor_io import TORCH_DTYPES, Progress, copy_range, read_tensor, write_tensor
from release.lora.workspace import Workspace


def write_merged_shard(header: SafetensorsHeader, out_path: Path, plan: AdapterPlan, adapter_fd: int,
                       workspace: Workspace, progress: Progress) -> int:
    """Write `header.path` merged with `plan` to `out_path` (fsynced); return how many tensors changed.

    Each merged tensor is written by a writer thread while the next one is computed (pwrite and torch
    both release the GIL); the two alternate between two read slots, so a slot is reused only once
    its write has finished.
    """
    touched = sorted((info for name, info in header.tensors.items() if plan.touches(name)), key=lambda i: i.start)
    size = header.path.stat().st_size
    src = os.open(header.path, os.O_RDONLY)
    try:
        dst = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(dst, size)
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="relctl-write") as writer:
                pending: Future[int] | None = None
                position = 0
                for i, info in enumerate(touched):
                    copy_range(src, dst, position, info.start, progress)
                    tensor = merge_tensor(info, src, adapter_fd, plan, workspace, slot=f"base{i % 2}")
                    _finish(pending, progress)
                    pending = writer.submit(write_tensor, dst, tensor, info)
                    position = info.end
                copy_range(src, dst, position, size, progress)
                _finish(pending, progress)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return len(touched)


def _finish(pending: Future[int] | None, progress: Progress) -> None:
    if pending is not None:
        progress(pending.result())


def merge_tensor(info: TensorInfo, base_fd: int, adapter_fd: int, plan: AdapterPlan,
                 workspace: Workspace, slot: str = "base") -> torch.Tensor:
    """The merged value of one base tensor: its adapter replacement if any, then its LoRA fold if any.

    That is the order peft applies them in: `PeftModel.from_pretrained` loads trained base parameters
    (modules_to_save copies, bias="all" biases) into the model, then `merge_and_unload` folds.
    """
    replacement = plan.replacements.get(info.name)
    if replacement is not None:
        # load_state_dict copies the saved values into the base parameter, i.e. casts to its dtype
        tensor = read_tensor(adapter_fd, replacement).to(TORCH_DTYPES[info.dtype])
    else:
        tensor = read_tensor(base_fd, info, workspace, slot)
    lora = plan.folds.get(info.name)
    if lora is not None:
        tensor = fold_weight(tensor, lora, adapter_fd, workspace)
    bias_lora = plan.bias_folds.get(info.name)
    if bias_lora is not None and bias_lora.b_bias is not None:
        b_bias = _adapter_piece(adapter_fd, bias_lora.b_bias, tensor.dtype)
        tensor = fold.fold_lora_bias(tensor, b_bias, bias_lora.scaling)
    return tensor


def fold_weight(weight: torch.Tensor, lora: LoraModule, adapter_fd: int, workspace: Workspace) -> torch.Tensor:
    """Fold one LoRA pair (plain or DoRA, Linear/Conv1D or Embedding) into its base weight."""
    a = _adapter_piece(adapter_fd, lora.a, weight.dtype)
    b = _adapter_piece(adapter_fd, lora.b, weight.dtype)
    magnitude = None if lora.magnitude is None else _adapter_piece(adapter_fd, lora.magnitude, weight.dtype)
    if lora.kind == "embedding":
        if magnitude is not None:
            return fold.fold_dora_embedding(weight, a, b, magnitude, lora.scaling)
        return fold.fold_embedding(weight, a, b, lora.scaling)
    if magnitude is not None:
        return fold.fold_dora_linear(weight, a, b, magnitude, lora.scaling, lora.fan_in_fan_out)
    return fold.fold_linear(weight, a, b, lora.scaling, lora.fan_in_fan_out, workspace)


def _adapter_piece(adapter_fd: int, info: TensorInfo, base_dtype: torch.dtype) -> torch.Tensor:
    return read_tensor(adapter_fd, info).to(fold.adapter_dtype(base_dtype))
