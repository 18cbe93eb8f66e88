"""Index a PEFT LoRA adapter against a base checkpoint: what happens to each base tensor.

Nothing is loaded here: the adapter's safetensors header is matched with the base's headers, and every
key, shape and dtype is checked before the first byte of output is written.

peft 0.21 saves, under the prefix `base_model.model.`:
    <module>.lora_A.weight / .lora_B.weight / .lora_B.bias   a LoRA pair on a Linear or Conv1D (+ lora_bias)
    <module>.lora_embedding_A / .lora_embedding_B             a LoRA pair on an Embedding
    <module>.lora_magnitude_vector                            DoRA's magnitude
    <module>.base_layer.<param>                               a base parameter the adapter trained (bias="all")
    <any other tensor path>                                   modules_to_save copies and trained biases,
                                                              which replace the base tensor of that path
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from release.core.checkpoint import SafetensorsHeader, TensorInfo, read_header
from release.core.errors import InputError
from release.lora.settings import LoraSettings

ADAPTER_FILE = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
PIECES = {
    ".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_B.bias": "B_bias",
    ".lora_embedding_A": "A", ".lora_embedding_B": "B",
    ".lora_magnitude_vector": "magnitude", ".lora_magnitude_vector.weight": "magnitude",
}
BaseIndex = dict[str, tuple[Path, TensorInfo]]


@dataclass(frozen=True)
class LoraModule:
    """One LoRA pair (with its DoRA magnitude and lora_bias) that folds into `<path>.weight`."""

    path: str
    kind: Literal["linear", "embedding"]
    a: TensorInfo
    b: TensorInfo
    scaling: float
    fan_in_fan_out: bool
    magnitude: TensorInfo | None = None
    b_bias: TensorInfo | None = None


@dataclass
class AdapterPlan:
    """For every base tensor the adapter touches: a replacement tensor, a LoRA fold, or both."""

    header: SafetensorsHeader
    folds: dict[str, LoraModule] = field(default_factory=dict)  # base weight name -> LoRA pair
    bias_folds: dict[str, LoraModule] = field(default_factory=dict)  # base bias name -> pair with lora_B.bias
    replacements: dict[str, TensorInfo] = field(default_factory=dict)  # base name -> adapter tensor

    def touches(self, name: str) -> bool:
        return name in self.folds or name in self.bias_folds or name in self.replacements


def plan_adapter(adapter_dir: Path, settings: LoraSettings, base: BaseIndex) -> AdapterPlan:
    """Match every adapter tensor with the base tensor it changes; refuse any that does not fit."""
    path = adapter_dir / ADAPTER_FILE
    if not path.is_file():
        raise InputError(f"{adapter_dir.name}: {ADAPTER_FILE} is missing",
                         hint="save the adapter with peft's save_pretrained(..., safe_serialization=True)")
    plan = AdapterPlan(header=read_header(path))
    pieces: dict[str, dict[str, TensorInfo]] = {}
    kinds: dict[str, Literal["linear", "embedding"]] = {}
    for key, info in plan.header.tensors.items():
        _check_float(key, info.dtype)
        inner = _strip_prefix(key)
        piece = next((p for p in PIECES if inner.endswith(p)), None)
        if piece is not None:
            module = inner[: -len(piece)]
            pieces.setdefault(module, {})[PIECES[piece]] = info
            if "embedding" in piece:
                kinds[module] = "embedding"
        elif ".lora_" in inner or inner.startswith("lora_"):
            raise InputError(f"{ADAPTER_FILE}: tensor '{key}' is not a LoRA piece relctl knows",
                             hint="relctl merges peft LoRA/DoRA adapters; re-save the adapter with peft 0.21")
        else:
            target = inner.replace(".base_layer.", ".")
            _check_replacement(key, info, target, base)
            plan.replacements[target] = info
    if not pieces:
        raise InputError(f"{ADAPTER_FILE}: holds no LoRA tensors", hint="save the trained adapter, not an empty one")
    for module, found in sorted(pieces.items()):
        lora = _lora_module(module, kinds.get(module, "linear"), found, settings, base)
        plan.folds[f"{module}.weight"] = lora
        if lora.b_bias is not None:
            plan.bias_folds[f"{module}.bias"] = lora
    return plan


def _strip_prefix(key: str) -> str:
    if not key.startswith(KEY_PREFIX):
        raise InputError(f"{ADAPTER_FILE}: tensor '{key}' does not start with '{KEY_PREFIX}'",
                         hint="save the adapter with PeftModel.save_pretrained, which writes peft's key layout")
    return key[len(KEY_PREFIX):]


def _check_float(key: str, dtype: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise InputError(f"{ADAPTER_FILE}: tensor '{key}' has dtype {dtype}; LoRA weights must be floating point",
                         hint="save the adapter unquantized (fp32, fp16 or bf16)")


def _no_base_tensor(key: str, wanted: str) -> InputError:
    return InputError(
        f"{ADAPTER_FILE}: tensor '{key}' matches no base tensor (looked for '{wanted}')",
        hint="the adapter was trained for a different base model; check base_model_name_or_path",
    )


def _shape_error(name: str, got: tuple[int, ...], need: tuple[int, ...], what: str = "base weight") -> InputError:
    return InputError(
        f"{ADAPTER_FILE}: tensor '{name}' has shape {_fmt(got)}, {what} needs {_fmt(need)}",
        hint="the adapter was trained for a different base model; check base_model_name_or_path",
    )


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _check_replacement(key: str, info: TensorInfo, target: str, base: BaseIndex) -> None:
    if target not in base:
        raise _no_base_tensor(key, target)
    need = base[target][1].shape
    if info.shape != need:
        raise _shape_error(target, info.shape, need, what="base tensor")
    if base[target][1].dtype not in FLOAT_DTYPES:
        raise InputError(f"{ADAPTER_FILE}: tensor '{key}' replaces '{target}', whose dtype "
                         f"{base[target][1].dtype} relctl cannot write exactly",
                         hint="merge an unquantized base checkpoint")


def _lora_module(module: str, kind: Literal["linear", "embedding"], found: dict[str, TensorInfo],
                 settings: LoraSettings, base: BaseIndex) -> LoraModule:
    weight_name = f"{module}.weight"
    for piece in ("A", "B"):
        if piece not in found:
            raise InputError(f"{ADAPTER_FILE}: module '{module}' has no lora_{piece} tensor",
                             hint="the adapter file is incomplete; re-save it with peft's save_pretrained")
    if weight_name not in base:
        raise _no_base_tensor(found["A"].name, weight_name)
    weight = base[weight_name][1]
    if len(weight.shape) != 2 or weight.dtype not in FLOAT_DTYPES:
        raise InputError(f"{ADAPTER_FILE}: module '{module}' targets a {weight.dtype}{list(weight.shape)} weight; "
                         "relctl folds LoRA into 2-D floating-point weights only",
                         hint="merge Conv or quantized layers with peft's merge_and_unload")
    r = settings.rank_and_alpha(module)[0]
    a, b = found["A"], found["B"]
    if kind == "embedding":
        # Embedding LoRA: A is (r, num_embeddings), B is (embedding_dim, r); the delta is (B @ A).T.
        fan_in_fan_out, out_dim, in_dim = True, weight.shape[1], weight.shape[0]
    else:
        fan_in_fan_out = _decide_transpose(weight.shape, a.shape, b.shape, settings.fan_in_fan_out)
        out_dim, in_dim = (weight.shape[1], weight.shape[0]) if fan_in_fan_out else weight.shape
    _check_shape(f"{module}.lora_{'embedding_' if kind == 'embedding' else ''}A", a.shape, (r, in_dim))
    _check_shape(f"{module}.lora_{'embedding_' if kind == 'embedding' else ''}B", b.shape, (out_dim, r))
    magnitude = _magnitude(module, found, settings, out_dim)
    b_bias = _lora_bias(module, kind, found, settings, base, out_dim)
    return LoraModule(path=module, kind=kind, a=a, b=b, scaling=settings.scaling(module),
                      fan_in_fan_out=fan_in_fan_out, magnitude=magnitude, b_bias=b_bias)


def _decide_transpose(weight: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...], configured: bool) -> bool:
    """Conv1D (GPT-2) stores (in, out), Linear (out, in); the base tensor's shape decides, as peft decides
    by the module type. Only a square weight leaves it to adapter_config's fan_in_fan_out, which peft sets
    to True whenever it wrapped a Conv1D."""
    if len(a) == 2 and len(b) == 2 and weight[0] != weight[1]:
        if (b[0], a[1]) == (weight[1], weight[0]):
            return True
        if (b[0], a[1]) == (weight[0], weight[1]):
            return False
    return configured


def _check_shape(name: str, got: tuple[int, ...], need: tuple[int, ...]) -> None:
    if got != need:
        raise _shape_error(name, got, need)


def _magnitude(module: str, found: dict[str, TensorInfo], settings: LoraSettings, out_dim: int) -> TensorInfo | None:
    magnitude = found.get("magnitude")
    if settings.use_dora != (magnitude is not None):
        state = "has no" if settings.use_dora else "has a"
        raise InputError(f"{ADAPTER_FILE}: module '{module}' {state} DoRA magnitude but use_dora={settings.use_dora}",
                         hint="adapter_config.json and adapter_model.safetensors disagree; re-save the adapter")
    if magnitude is not None:
        _check_shape(f"{module}.lora_magnitude_vector", magnitude.shape, (out_dim,))
    return magnitude


def _lora_bias(module: str, kind: str, found: dict[str, TensorInfo], settings: LoraSettings,
               base: BaseIndex, out_dim: int) -> TensorInfo | None:
    b_bias = found.get("B_bias")
    if kind == "embedding" and settings.lora_bias:
        raise InputError(f"{ADAPTER_FILE}: module '{module}' is an embedding and lora_bias=True",
                         hint="peft does not support lora_bias on embeddings; retrain with lora_bias=False")
    if b_bias is None:
        if settings.lora_bias and kind == "linear":
            raise InputError(f"{ADAPTER_FILE}: module '{module}' has no lora_B.bias but lora_bias=True",
                             hint="adapter_config.json and adapter_model.safetensors disagree; re-save the adapter")
        return None
    if not settings.lora_bias:
        raise InputError(f"{ADAPTER_FILE}: module '{module}' has a lora_B.bias but lora_bias=False",
                         hint="adapter_config.json and adapter_model.safetensors disagree; re-save the adapter")
    bias_name = f"{module}.bias"
    if bias_name not in base:
        raise InputError(f"{ADAPTER_FILE}: module '{module}' has lora_bias=True but the base layer has no bias",
                         hint="peft cannot merge this adapter either; retrain with lora_bias=False")
    _check_shape(f"{module}.lora_B.bias", b_bias.shape, (out_dim,))
    return b_bias
