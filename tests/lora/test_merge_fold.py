"""fold.py against peft's own layers at realistic sizes: the row-block and buffer-reuse paths included.

The tiny models of test_merge.py never exceed one widening block (fold.WIDE_BLOCK elements); these
weights do, and they have the shapes of a real 7B projection's slice, where GEMM kernels differ.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers.pytorch_utils import Conv1D

from release.lora import fold
from release.lora.workspace import Workspace

SHAPES = [(1024, 2048), (2816, 512)]  # (out, in); both span several widening blocks


class OneLayer(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.proj = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x)
        return out


def _peft_fold(layer: torch.nn.Module, config: LoraConfig, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """peft's merged weight, and the adapter tensors as peft holds them (fp32 after autocast)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(OneLayer(layer), config)
    gen = torch.Generator().manual_seed(seed)
    pieces = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data + 0.05 * torch.randn(param.shape, generator=gen)
            pieces[name.split(".")[-3]] = param.data.clone()
    merged = model.merge_and_unload().proj.weight.detach()
    return merged, pieces


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view({2: torch.int16, 4: torch.int32}[tensor.element_size()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("conv1d", [False, True], ids=["linear", "conv1d"])
def test_fold_linear_matches_peft_at_size(dtype: torch.dtype, shape: tuple[int, int], conv1d: bool) -> None:
    out_dim, in_dim = shape
    torch.manual_seed(0)
    layer: torch.nn.Module = Conv1D(out_dim, in_dim) if conv1d else torch.nn.Linear(in_dim, out_dim, bias=False)
    layer = layer.to(dtype)
    base = layer.weight.detach().clone()
    config = LoraConfig(r=16, lora_alpha=32, target_modules=["proj"], fan_in_fan_out=conv1d, use_rslora=conv1d)
    expected, pieces = _peft_fold(layer, config, seed=1)
    scaling = 32 / 16**0.5 if conv1d else 32 / 16

    workspace = Workspace()
    for _ in range(2):  # the second round reuses the buffers the first one grew
        ours = fold.fold_linear(base.clone(), pieces["lora_A"], pieces["lora_B"], scaling, conv1d, workspace)
        assert torch.equal(_bits(ours), _bits(expected))
    plain = fold.fold_linear(base.clone(), pieces["lora_A"], pieces["lora_B"], scaling, conv1d)
    assert torch.equal(_bits(plain), _bits(expected))
    assert not torch.equal(_bits(plain), _bits(base))
    assert base.numel() > fold.WIDE_BLOCK


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_dora_linear_matches_peft_at_size(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(2048, 1024, bias=False).to(dtype)
    base = layer.weight.detach().clone()
    config = LoraConfig(r=16, lora_alpha=16, target_modules=["proj"], use_dora=True)
    expected, pieces = _peft_fold(layer, config, seed=2)

    ours = fold.fold_dora_linear(base.clone(), pieces["lora_A"], pieces["lora_B"],
                                 pieces["lora_magnitude_vector"], 1.0, False)

    assert torch.equal(_bits(ours), _bits(expected))


def test_workspace_reuses_and_grows() -> None:
    workspace = Workspace()
    small = workspace.take("slot", (4, 4), torch.float32)
    again = workspace.take("slot", (2, 2), torch.bfloat16)
    assert again.data_ptr() == small.data_ptr() and workspace.nbytes == 64
    bigger = workspace.take("slot", (16, 16), torch.float32)
    assert tuple(bigger.shape) == (16, 16) and workspace.nbytes == 1024
