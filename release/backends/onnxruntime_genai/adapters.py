"""LoRA adapters on an onnxruntime-genai base (docs/adapters.md).

og.Adapters feeds an `.onnx_adapter` file's tensors to the session as graph inputs, by name. The model
builder builds no such inputs (its `adapter_path` option bakes one adapter into the graph as initializers,
quantized with the rest at int4), so a LoRA-ready base is the builder's own graph with a LoRA path added
here beside each target projection:

    y = base(x) + (x @ A) @ B          A: [in, rank], B: [rank, out] (B already times the scaling)

A and B are graph inputs that are also initializers ("overridable initializers"): zero by default, so the
base answers exactly as the base when no adapter is active, and any adapter's tensors override them per
generator (`Generator.set_active_adapter`). Their rank is a symbolic dimension: adapters of any rank load.
The LoRA path is float at the graph's activation dtype whatever the base's precision (an int4 base keeps
MatMulNBits for its own weights; the adapter stays unquantized, as PEFT trained it).

The builder packs q/k/v into one `qkv_proj` MatMul: when any of them is a target, each of q, k and v gets
its own LoRA path, and their outputs are concatenated in the packed order before the one Add.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from release.core.errors import InputError
from release.core.jsonfile import load_json_object

if TYPE_CHECKING:
    import numpy as np  # annotations; each function that computes imports it (GenaiSettings, read from
    # release.yaml, must not load numpy: a refused release.yaml answers at about `relctl --help`'s cost)

MODEL_FILE = "model.onnx"
ADAPTER_FILE = "adapter.onnx_adapter"
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
HINT = "release this run merged instead: relctl promote RUN (without --onto)"
RANK_DIM = "lora_rank"
# The zero defaults' rank: the least work on the base's own requests (an adapter of any rank overrides them).
DEFAULT_RANK = 1
# Where a PEFT module name lives in the builder's graph (/model/layers.N/<block>/<module>/MatMul...).
BLOCKS = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "o_proj": "attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
PACKED_QKV = ("q_proj", "k_proj", "v_proj")
_PEFT_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoraReady(BaseModel):
    """`convert.onnxruntime-genai.adapters`: build the base LoRA-ready for adapters on these modules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_modules: list[str] = Field(default_factory=lambda: sorted(BLOCKS), min_length=1,
                                      description="the PEFT target modules its adapters train (q_proj k_proj "
                                                  "v_proj o_proj gate_proj up_proj down_proj, or all-linear); "
                                                  "adapters of any rank load")

    @field_validator("target_modules")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        if value == ["all-linear"]:
            return sorted(BLOCKS)
        unknown = sorted(set(value) - set(BLOCKS))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a projection the LoRA-ready graph takes "
                             f"({', '.join(BLOCKS)}, or all-linear)")
        return sorted(set(value))


class GenaiSettings(BaseModel):
    """`convert.onnxruntime-genai` in release.yaml: options that shape the build."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adapters: LoraReady | None = Field(None, description="build the base LoRA-ready: zero LoRA inputs beside "
                                       "these projections, so adapters released onto it serve unmerged "
                                       "(docs/adapters.md)")


def input_name(layer: int, module: str, which: str) -> str:
    """The graph input (and adapter parameter) name of one LoRA matrix: `which` is "A" or "B"."""
    return f"model.layers.{layer}.{BLOCKS[module]}.{module}.lora_{which}"


@dataclass(frozen=True)
class LoraInput:
    name: str
    shape: tuple[int | str, ...]   # [in, rank] or [rank, out]; rank is RANK_DIM
    dtype: Any                     # numpy dtype of the graph's activations


def lora_inputs(model_dir: Path) -> dict[str, LoraInput]:
    """The LoRA inputs a LoRA-ready base declares (empty for a plain build), read from the graph alone."""
    import onnx  # noqa: PLC0415

    graph = onnx.load(str(model_dir / MODEL_FILE), load_external_data=False).graph
    found: dict[str, LoraInput] = {}
    for value in graph.input:
        if ".lora_" not in value.name:
            continue
        ttype = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in ttype.shape.dim)
        found[value.name] = LoraInput(value.name, dims, onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type))
    return found


def ready_targets(model_dir: Path) -> list[str]:
    """The modules a LoRA-ready base takes adapters on (sorted), from its graph inputs."""
    return sorted({name.split(".")[4] for name in lora_inputs(model_dir)})


# -- building a LoRA-ready base ---------------------------------------------------------------------------
def make_lora_ready(model_dir: Path, targets: list[str], rank: int = DEFAULT_RANK) -> list[str]:
    """Add a zero LoRA path on every `targets` projection of every layer of model_dir/model.onnx, in place
    (the weights' external data file is left as it is); returns notes. InputError for a target the graph
    has no projection for."""
    import numpy as np  # noqa: PLC0415
    import onnx  # noqa: PLC0415
    from onnx import helper, numpy_helper  # noqa: PLC0415

    unknown = sorted(set(targets) - set(BLOCKS))
    if unknown:
        raise InputError(f"adapters.target_modules: {', '.join(unknown)} not among {', '.join(BLOCKS)}",
                         hint="name the PEFT target modules the adapters will train")
    path = model_dir / MODEL_FILE
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    shapes = _weight_shapes(model)
    nodes = {node.name: node for node in graph.node}
    decoder = load_json_object(model_dir / "genai_config.json", "re-run convert")["model"]["decoder"]
    head = int(decoder["head_size"])
    sizes = {"q_proj": int(decoder["num_attention_heads"]) * head,
             "k_proj": int(decoder.get("num_key_value_heads", decoder["num_attention_heads"])) * head}
    sizes["v_proj"] = sizes["k_proj"]
    layers = int(decoder["num_hidden_layers"])
    added: list[Any] = []

    def lora_path(layer: int, module: str, x: str, d_in: int, d_out: int, elem: int) -> str:
        np_dtype = helper.tensor_dtype_to_np_dtype(elem)
        a, b = input_name(layer, module, "A"), input_name(layer, module, "B")
        graph.initializer.extend([numpy_helper.from_array(np.zeros((d_in, rank), np_dtype), a),
                                  numpy_helper.from_array(np.zeros((rank, d_out), np_dtype), b)])
        graph.input.extend([helper.make_tensor_value_info(a, elem, [d_in, RANK_DIM]),
                            helper.make_tensor_value_info(b, elem, [RANK_DIM, d_out])])
        base = f"/model/layers.{layer}/{BLOCKS[module]}/{module}/lora"
        added.append(helper.make_node("MatMul", [x, a], [f"{base}_A/output_0"], name=f"{base}_A/MatMul"))
        added.append(helper.make_node("MatMul", [f"{base}_A/output_0", b], [f"{base}_B/output_0"],
                                      name=f"{base}_B/MatMul"))
        return f"{base}_B/output_0"

    for layer in range(layers):
        for module in sorted({"qkv_proj" if t in PACKED_QKV and _find(nodes, layer, t) is None else t
                              for t in targets}):
            block = "attn" if module == "qkv_proj" else BLOCKS[module]
            node = _find(nodes, layer, module, block)
            if node is None:
                raise InputError(f"adapters.target_modules: the built graph has no {module} projection in layer "
                                 f"{layer}", hint="target the modules this family's builder emits (docs/adapters.md)")
            if node.name not in shapes:
                raise InputError(f"adapters.target_modules: {node.name} has no weight initializer to read its "
                                 "shape from", hint="build the base without convert.onnxruntime-genai.adapters")
            x, out = node.input[0], node.output[0]
            d_in, d_out, elem = shapes[node.name]
            if module == "qkv_proj" and sum(sizes.values()) != d_out:
                raise InputError(f"adapters.target_modules: {node.name} is {d_out} wide, not q+k+v = "
                                 f"{sum(sizes.values())} (genai_config.json)", hint="report this family's build")
            if module == "qkv_proj":
                # All three parts (zero unless an adapter sets them), concatenated in the packed order.
                parts = [lora_path(layer, part, x, d_in, sizes[part], elem) for part in PACKED_QKV]
                delta = f"/model/layers.{layer}/attn/qkv_proj/lora/Concat/output_0"
                added.append(helper.make_node("Concat", parts, [delta], axis=-1,
                                              name=f"/model/layers.{layer}/attn/qkv_proj/lora/Concat"))
            else:
                delta = lora_path(layer, module, x, d_in, d_out, elem)
            # The projection now writes <out>/base; the Add takes over its output name, so every consumer
            # reads base + LoRA without being rewired.
            node.output[0] = f"{out}/base"
            name = f"/model/layers.{layer}/{block}/{module}/lora/Add"
            added.append(helper.make_node("Add", [node.output[0], delta], [out], name=name))
    graph.node.extend(added)
    _toposort(graph)
    onnx.save(model, str(path))
    return [f"LoRA-ready: {', '.join(sorted(targets))} in {layers} layers (zero adapters of rank {rank} by default)"]


def _find(nodes: dict[str, Any], layer: int, module: str, block: str | None = None) -> Any:
    block = block or BLOCKS.get(module, "attn")
    prefix = f"/model/layers.{layer}/{block}/{module}/MatMul"
    for name, node in nodes.items():
        if name.startswith(prefix) and node.op_type in ("MatMul", "MatMulNBits"):
            return node
    return None


def _weight_shapes(model: Any) -> dict[str, tuple[int, int, int]]:
    """Each projection node's (in, out, activation dtype): a float MatMul's weight is [in, out]; a
    MatMulNBits states K and N as attributes, its activations are its scales' dtype (the op's T1)."""
    from onnx import helper  # noqa: PLC0415

    inits = {t.name: t for t in model.graph.initializer}
    found: dict[str, tuple[int, int, int]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
            w = inits[node.input[1]]
            found[node.name] = (int(w.dims[0]), int(w.dims[1]), int(w.data_type))
        elif node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            found[node.name] = (int(attrs["K"]), int(attrs["N"]), int(inits[node.input[2]].data_type))
    return found


def _toposort(graph: Any) -> None:
    """ONNX wants nodes in topological order; the LoRA nodes were appended after their consumers."""
    produced = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[Any] = []
    while pending:
        rest = []
        for node in pending:
            if all(i in produced for i in node.input):
                ordered.append(node)
                produced.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise InputError("LoRA-ready graph: a cycle or a missing input after adding the LoRA paths",
                             hint="report this build (docs/adapters.md)")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


# -- an adapter for a LoRA-ready base ---------------------------------------------------------------------
def adapter_parameters(adapter_dir: Path, model_dir: Path) -> dict[str, np.ndarray]:
    """The PEFT adapter in `adapter_dir` as the LoRA-ready base's graph inputs: A = lora_A.T, B = (lora_B *
    scaling).T, named and shaped exactly as the graph declares them; InputError for anything else."""
    import numpy as np  # noqa: PLC0415
    from safetensors.numpy import load_file  # noqa: PLC0415

    label = f"{adapter_dir.name}/{PEFT_FILES[0]}"
    cfg = load_json_object(adapter_dir / PEFT_FILES[0], "re-save the adapter with peft's save_pretrained", label)
    if cfg.get("peft_type") != "LORA":
        raise InputError(f"{label}: peft_type {cfg.get('peft_type')!r}; onnxruntime-genai serves LoRA only", hint=HINT)
    for option, why in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save (whole replaced modules)"),
                        ("fan_in_fan_out", "fan_in_fan_out weights"), ("lora_bias", "LoRA biases"),
                        ("rank_pattern", "per-module ranks"), ("alpha_pattern", "per-module alphas")):
        if cfg.get(option):
            raise InputError(f"{label}: {why} not served by the LoRA-ready graph", hint=HINT)
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise InputError(f"{label}: r={rank!r}, lora_alpha={alpha!r}", hint="re-save the adapter with peft")
    scaling = float(alpha) / (rank ** 0.5 if cfg.get("use_rslora") else rank)  # as peft's LoraLayer
    declared = lora_inputs(model_dir)
    if not declared:
        raise InputError(f"{model_dir.parent.name}: the base was not built LoRA-ready (its graph has no LoRA "
                         "inputs)", hint="re-release the base with convert.onnxruntime-genai.adapters set "
                                         "(docs/adapters.md), or release this run merged")
    tensors = load_file(str(adapter_dir / PEFT_FILES[1]))
    params: dict[str, np.ndarray] = {}
    for key, value in tensors.items():
        match = _PEFT_KEY.search(key)
        if match is None or match.group(2) not in BLOCKS:
            raise InputError(f"{adapter_dir.name}: adapter weight {key} is not a LoRA on a projection the "
                             f"LoRA-ready base takes ({', '.join(ready_targets(model_dir))})", hint=HINT)
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        name = input_name(layer, module, which)
        if name not in declared:
            raise InputError(f"{adapter_dir.name}: targets {module}, but the base was built LoRA-ready for "
                             f"{', '.join(ready_targets(model_dir))} only",
                             hint="re-release the base LoRA-ready for this module, or release this run merged")
        matrix = value.astype(np.float32) * (scaling if which == "B" else 1.0)
        params[name] = np.ascontiguousarray(matrix.T.astype(declared[name].dtype))
        want = declared[name].shape
        fixed = want[0] if which == "A" else want[1]
        got = params[name].shape[0] if which == "A" else params[name].shape[1]
        if got != fixed:
            raise InputError(f"{adapter_dir.name}: {key} has {'in' if which == 'A' else 'out'} size {got}, the "
                             f"base's {name} takes {fixed}", hint="the adapter was trained on another shape")
    return params


def export(adapter_dir: Path, model_dir: Path, out: Path) -> None:
    """out/adapter.onnx_adapter (onnxruntime's adapter format) beside the PEFT files it was made from."""
    import shutil  # noqa: PLC0415

    import onnxruntime as ort  # noqa: PLC0415 - native libraries; only adapter releases need it

    params = adapter_parameters(adapter_dir, model_dir)
    out.mkdir(parents=True, exist_ok=True)
    writer = ort.AdapterFormat()
    writer.set_adapter_version(1)
    writer.set_model_version(1)
    writer.set_parameters({name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in params.items()})
    writer.export_adapter(str(out / ADAPTER_FILE))
    for name in PEFT_FILES:
        shutil.copy2(adapter_dir / name, out / name)


def adapter_file(folder: Path) -> Path:
    path = folder / ADAPTER_FILE
    if not path.is_file():
        raise InputError(f"{folder.name}: {ADAPTER_FILE} is missing (not an onnxruntime-genai adapter)",
                         hint="release the adapter onto this base: relctl promote RUN --onto BASE@production")
    return path


def adapter_parameters_of(folder: Path) -> dict[str, np.ndarray]:
    """The tensors of an exported .onnx_adapter file, by graph input name."""
    import numpy as np  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415

    reader = ort.AdapterFormat.read_adapter(str(adapter_file(folder)))
    return {name: np.array(value.numpy()) for name, value in reader.get_parameters().items()}
