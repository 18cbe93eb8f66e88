"""Hostile checkpoints and artifact paths: refused at intake, exit 2, the tensor or path named, in seconds."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from release.core.errors import InputError
from release.core.numerics import FP16_MAX, fp16_overflows, tensor_max_abs
from release.registry import Registry
from release.registry.store import resolve_store
from tests.stages.test_promote_errors import log_checkpoint_run, promote


def test_max_abs_reads_every_float_dtype_and_names_a_nan(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": np.array([1.0, -3.5], dtype=np.float32), "b": np.array([2.0, 70000.0], dtype=np.float64),
               "c": np.array([1.5], dtype=np.float16), "ids": np.array([7, 9], dtype=np.int64)}, str(path))
    peaks = tensor_max_abs([path])
    assert peaks == {"a": 3.5, "b": 70000.0, "c": 1.5}
    assert fp16_overflows(peaks) == ["b"] and FP16_MAX == 65504.0
    save_file({"fine": np.ones(3, dtype=np.float32), "bad": np.array([1.0, np.nan], dtype=np.float32)}, str(path))
    with pytest.raises(InputError, match="tensor 'bad' contains NaN"):
        tensor_max_abs([path])


def test_bf16_is_widened_exactly(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    # bf16 bit patterns of 1.0, -2.0 and +Inf, written as raw uint16 under a BF16 header.
    raw = np.array([0x3F80, 0xC000, 0x7F80], dtype="<u2").tobytes()
    header = b'{"x":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + raw)
    with pytest.raises(InputError, match="tensor 'x' contains Inf"):
        tensor_max_abs([path])


def _poisoned(tiny_checkpoint: Path, tmp_path: Path, value: float) -> Path:
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, folder)
    weights = load_file(str(folder / "model.safetensors"))
    name = sorted(k for k in weights if k.endswith("down_proj.weight"))[0]
    weights[name] = weights[name].copy()
    weights[name].flat[3] = value
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def test_a_nan_weight_is_refused_at_intake(project_dir: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    run = log_checkpoint_run(project_dir, _poisoned(tiny_checkpoint, tmp_path, float("nan")))
    started = time.monotonic()
    result = promote(project_dir, run)
    assert result.exit_code == 2, result.output + result.stderr
    assert "down_proj.weight' contains NaN" in result.stderr
    assert time.monotonic() - started < 30
    assert not list((project_dir / ".relctl" / "work").rglob("merge-*"))
    assert Registry(resolve_store(project_dir)).list_models() == []


def test_a_weight_beyond_fp16_is_refused_for_fp16_and_warned_when_configured(
        project_dir: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    run = log_checkpoint_run(project_dir, _poisoned(tiny_checkpoint, tmp_path, 1.0e5))
    # fp16 is built for a GPU (an fp16 CPU build is refused by the run contract before any download).
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("convert:\n  precision: fp16\n  execution_provider: cuda\n")
    refused = promote(project_dir, run, "--config", str(gpu))
    assert refused.exit_code == 2, refused.output + refused.stderr
    assert "above fp16's 65504" in refused.stderr and "down_proj.weight" in refused.stderr
    config = tmp_path / "release.yaml"
    config.write_text("convert:\n  precision: fp16\n  execution_provider: cuda\n  fp16_overflow: warn\n")
    warned = promote(project_dir, run, "--config", str(config))
    assert "will be Inf at fp16" in warned.stderr


def test_an_artifact_path_outside_the_run_is_bad_input(project_dir: Path, tiny_checkpoint: Path,
                                                         tmp_path: Path) -> None:
    run = log_checkpoint_run(project_dir, tiny_checkpoint)
    for bad in ("../../etc", "/etc/passwd"):
        config = tmp_path / "release.yaml"
        config.write_text(f"source:\n  artifact_path: '{bad}'\n")
        result = promote(project_dir, run, "--config", str(config))
        assert result.exit_code == 2, result.output + result.stderr
        assert f"artifact path '{bad}' points outside the run" in result.stderr and "hint: " in result.stderr


def test_a_symlink_in_the_artifact_store_is_bad_input(project_dir: Path, tiny_checkpoint: Path) -> None:
    run = log_checkpoint_run(project_dir, tiny_checkpoint)
    store = Registry(resolve_store(project_dir))
    root = Path(store.client.get_run(run).info.artifact_uri.removeprefix("file://")) / "checkpoint"
    (root / "config.json").unlink()
    os.symlink("/etc/hostname", root / "config.json")
    result = promote(project_dir, run)
    assert result.exit_code == 2, result.output + result.stderr
    assert "config.json' is a symbolic link" in result.stderr


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32", "F64"])
def test_max_abs_and_non_finite_values_from_the_bit_patterns(tmp_path: Path, dtype: str) -> None:
    """max |x| is exact for every float dtype (negative, subnormal and largest finite values), and a NaN
    is told from an Inf wherever it sits in a chunk."""
    import torch

    from release.core import numerics

    rng = np.random.default_rng(1)
    torch_dtype = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}[dtype]
    finfo = torch.finfo(torch_dtype)
    values = torch.tensor(rng.standard_normal(5000) * 3, dtype=torch.float64).to(torch_dtype)
    values[17] = -finfo.max  # the largest magnitude is negative
    values[18] = finfo.smallest_normal / 4  # subnormal
    path = tmp_path / "w.safetensors"

    def write(tensor: torch.Tensor) -> None:
        from safetensors.torch import save_file as save_torch

        save_torch({"w": tensor.contiguous()}, str(path))

    write(values)
    assert tensor_max_abs([path]) == {"w": float(values.abs().max().double())}
    write(values[18:19].abs())
    assert tensor_max_abs([path]) == {"w": float(values[18].abs().double())}
    old = numerics.CHUNK_ELEMENTS
    try:
        numerics.CHUNK_ELEMENTS = 1000  # the bad value in a later chunk than the first
        for bad, name in ((float("inf"), "Inf"), (float("-inf"), "Inf"), (float("nan"), "NaN")):
            poisoned = values.clone()
            poisoned[4321] = bad
            if name == "Inf":
                poisoned[100] = float("-inf")
            write(poisoned)
            with pytest.raises(InputError, match=f"tensor 'w' contains {name}"):
                tensor_max_abs([path])
        both = values.clone()
        both[3010], both[3020] = float("inf"), float("nan")  # one chunk: NaN is named over Inf
        write(both)
        with pytest.raises(InputError, match="contains NaN"):
            tensor_max_abs([path])
    finally:
        numerics.CHUNK_ELEMENTS = old
