"""The builder process relctl runs quantizes one weight at a time and writes exactly the builder's bytes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from release.backends.onnxruntime_genai.build_process import PEAK_MARKER
from release.backends.onnxruntime_genai.builder import builder_peak
from tests.backends.checkpoints import tiny_bf16_qwen


@pytest.fixture(scope="module", params=["tied", "untied"])
def qwen(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    """A tiny bf16 Qwen2 with tied embeddings (int4 then shares the embedding with lm_head, as Qwen2.5-1.5B
    does) or untied ones (the embedding stays an fp32 Gather, as the builder leaves Llama-3-8B's)."""
    out = tmp_path_factory.mktemp(f"{request.param}-qwen") / "checkpoint"
    return tiny_bf16_qwen(out, tiny_checkpoint, tied=request.param == "tied")


def build(module: str, checkpoint: Path, out: Path, precision: str) -> str:
    run = subprocess.run([sys.executable, "-m", module, "-i", str(checkpoint), "-o", str(out), "-p", precision,
                          "-e", "cpu", "-c", str(out.with_name(out.name + ".cache"))],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout


@pytest.mark.parametrize("precision", ["int4", "int8", "fp32"])
def test_streaming_quantization_writes_the_builders_bytes(qwen: Path, tmp_path: Path, precision: str) -> None:
    theirs = tmp_path / "builder"
    ours = tmp_path / "relctl"
    build("onnxruntime_genai.models.builder", qwen, theirs, precision)
    log = build("release.backends.onnxruntime_genai.build_process", qwen, ours, precision)
    # Every case here streams: int4 tied (the embedding reads lm_head's int4 weight), and int8 or untied
    # (the embedding stays an fp32 Gather: the builder's default op types are MatMul only).
    assert ("MatMul weights one at a time" in log) == (precision != "fp32")
    # The weights the builder casts lazily from the checkpoint are read through release_after_read: the
    # embedding, and at fp32 the o/gate/up/down MatMul weights of both layers too (qkv is a concatenation
    # the builder makes eagerly, not a view of the checkpoint).
    wrapped = int(re.search(r"relctl: (\d+) weights hand their checkpoint pages back", log).group(1))  # type: ignore[union-attr]
    assert wrapped >= (2 * 4 + 1 if precision == "fp32" else 1)
    assert log.rstrip().splitlines()[-1].startswith(PEAK_MARKER)
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def test_peak_is_read_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "convert.log"
    log.write_text(f"$ builder\nsaving\n{PEAK_MARKER} 123456\n")
    assert builder_peak(log) == 123456
    log.write_text("$ builder\ncrashed\n")
    assert builder_peak(log) is None


def test_checkpoint_pages_are_handed_back_and_no_data_is_lost(tmp_path: Path) -> None:
    """After a weight is quantized the builder process hands its checkpoint pages back to the kernel: only
    pages of a mapped .safetensors file, and nothing written in place is lost."""
    import numpy as np
    import torch

    from release.backends.onnxruntime_genai.build_process import pin_malloc_threshold, release_mapped_pages

    values = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB
    path = tmp_path / "model.safetensors"
    values.tofile(path)
    # A private writable mapping of the file, as transformers maps a checkpoint (rw-p in /proc/self/maps).
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c", shape=values.shape))
    assert float(mapped.sum()) == pytest.approx(float(values.sum()), rel=1e-5)  # every page read in
    assert release_mapped_pages(mapped) >= values.nbytes - 2 * 4096
    assert torch.equal(mapped, torch.from_numpy(values))  # read back from the file
    mapped[0, 0] = 12345.0  # written in place: that page is now the process's own
    release_mapped_pages(mapped[:1])
    assert float(mapped[0, 0]) == 12345.0
    anonymous = torch.from_numpy(values.copy())
    assert release_mapped_pages(anonymous) == 0 and torch.equal(anonymous, torch.from_numpy(values))
    assert release_mapped_pages(mapped.t()) > 0  # a transposed view covers the same pages
    assert pin_malloc_threshold()  # glibc on Linux, as on every release runner relctl supports
