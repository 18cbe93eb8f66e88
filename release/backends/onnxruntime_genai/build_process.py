"""`python -m release.backends.onnxruntime_genai.build_process <builder arguments>`: onnxruntime-genai's
model builder, run as its own command line runs it, with one change to how it quantizes, and its peak
memory reported.

The builder makes the whole fp32 graph lazily (each weight is computed from the checkpoint only when it
is written), but at int4/int8 its `to_nbits` first serializes that whole graph to one in-memory protobuf
(every weight at fp32: twice a bf16 checkpoint) and hands it to onnxruntime's MatMulNBitsQuantizer, which
copies weights again. `quantize_streaming` does what that quantizer does for the builder's plain case
(the default RTN method, QOperator MatMulNBits, MatMul weights: the builder's default op types, no
per-node overrides) one weight at a time on the lazy graph: materialize one fp32 weight, quantize it with
the same onnxruntime kernel (quantize_matmul_4bits / 8bits), replace the node by the same MatMulNBits
node (same names, attributes and bytes), drop the fp32 copy. An untied embedding stays an fp32 Gather, as
the builder leaves it; int8 and untied models stream too (the tests compare bytes for tied and untied, at
int4 and int8). Every other configuration goes through the builder's own `to_nbits`.

On exit it prints `relctl-builder-peak-rss-bytes <n>` (its ru_maxrss) as its last line.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import resource
import runpy
import sys
from typing import Any

import numpy as np

PEAK_MARKER = "relctl-builder-peak-rss-bytes"


def _plain_case(model: Any) -> bool:
    attrs = model.quant_attrs
    return (getattr(model, "quantization_algo", "default") == "default"
            and not getattr(model, "int4_customized_weight_config", None)
            and not getattr(model, "exact_quant_overrides", None)
            and not getattr(model, "exact_quant_override_names", None)
            and not attrs["use_qdq"] and "MatMul" in attrs["op_types_to_quantize"]
            and set(attrs["op_types_to_quantize"]) <= {"MatMul", "Gather"}
            # The builder's default op types are MatMul only. Asked for "Gather" at int4 the quantizer
            # would also make an untied embedding table GatherBlockQuantized, which this does not do: that
            # case goes through the builder's own path (at int8 the quantizer leaves a Gather alone).
            and not ("Gather" in attrs["op_types_to_quantize"] and int(attrs["bits"]) == 4
                     and any(node.op_type == "Gather" and node.inputs[0] is not None
                             and node.inputs[0].const_value is not None for node in model.model.graph))
            and model.ep == "cpu"
            and not any(attr.type in (_ir().AttributeType.GRAPH, _ir().AttributeType.GRAPHS)
                        for node in model.model.graph for attr in node.attributes.values()))


def _ir() -> Any:
    import onnx_ir  # noqa: PLC0415 - the builder's own IR library

    return onnx_ir


def quantize_streaming(model: Any) -> Any:
    """The builder's `to_nbits` for its plain case, one weight at a time (see the module docstring)."""
    from onnxruntime.capi._pybind_state import (  # noqa: PLC0415
        quantize_matmul_4bits,
        quantize_matmul_8bits,
    )

    attrs = model.quant_attrs
    bits, block_size = int(attrs["bits"]), int(attrs["matmul_block_size"])
    symmetric, accuracy = bool(attrs["is_symmetric"]), attrs["accuracy_level"]
    excluded = set(attrs["nodes_to_exclude"])
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    graph = model.model.graph
    model.model.opset_imports["com.microsoft"] = 1
    count = 0
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.name in excluded:
            continue
        if node.op_type == "MatMul":
            count += _quantize_matmul(graph, node, kernel, bits, block_size, symmetric, accuracy)
    # Read by the tests and the convert log's reader: the streaming path ran.
    print(f"relctl: quantized {count} MatMul weights one at a time", flush=True)
    return model.model


def _constant_2d(value: Any) -> tuple[Any, np.ndarray | None] | None:
    """(lazy checkpoint source, None) or (None, the whole fp32 array) for a 2-D fp32 initializer; None for
    anything the quantizer would not take here (not constant, not 2-D, not fp32: GPU builds)."""
    if value is None or value.const_value is None or not value.is_initializer() or len(value.shape or ()) != 2:
        return None
    source = _lazy_source(value.const_value)
    if source is not None:
        return source, None
    whole = np.ascontiguousarray(value.const_value.numpy())
    return (None, whole) if whole.dtype == np.float32 else None


def _columns(source: Any, whole: np.ndarray | None, c0: int, c1: int) -> np.ndarray:
    """Columns c0:c1 of the weight at fp32, contiguous."""
    if whole is not None:
        return np.ascontiguousarray(whole[:, c0:c1])
    return np.ascontiguousarray(source[:, c0:c1].float().numpy())


def _initializer(graph: Any, name: str, array: np.ndarray) -> Any:
    ir = _ir()
    tensor = ir.tensor(array, name=name)
    value = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def _replace(graph: Any, node: Any, inputs: list[Any], attributes: dict[str, Any], name: str,
             weight: Any, source: Any) -> None:
    """Put a com.microsoft MatMulNBits node where `node` was (same output name), drop the fp32 weight, and
    hand its checkpoint pages back."""
    ir = _ir()
    output = node.outputs[0]
    replacement = ir.Node("com.microsoft", "MatMulNBits", inputs,
                          attributes=ir.convenience.convert_attributes(dict(sorted(attributes.items()))),
                          name=name, num_outputs=1)
    graph.insert_before(node, replacement)
    new_output = replacement.outputs[0]
    new_output.shape, new_output.type = output.shape, output.type
    output_name = output.name
    output.replace_all_uses_with(new_output, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    new_output.name = output_name
    if not weight.uses():
        graph.initializers.pop(weight.name)  # the fp32 weight (and the checkpoint tensor it reads) goes
    if source is not None:
        release_mapped_pages(source)


def _quantize_matmul(graph: Any, node: Any, kernel: Any, bits: int, block_size: int, symmetric: bool,
                     accuracy: Any) -> int:
    """MatMul -> MatMulNBits as the quantizer's QOperator path writes it; 1 if it was quantized."""
    weight = node.inputs[1]
    found = _constant_2d(weight)
    if found is None:
        return 0
    source, whole = found
    rows, cols = (int(d) for d in (whole.shape if whole is not None else source.shape))
    kpack = 8 // bits
    k_blocks = (rows + block_size - 1) // block_size
    packed = np.zeros((cols, k_blocks, (block_size + kpack - 1) // kpack), dtype="uint8")
    zero_point = np.zeros((cols, (k_blocks + kpack - 1) // kpack), dtype="uint8")
    scales = np.zeros((cols, k_blocks), dtype=np.float32)
    # Columns are quantized independently (blocks run down a column), so a slice of columns at a
    # time gives the same bytes while the fp32 copy is a slice, not the whole weight (lm_head: ~1 GB).
    for c0 in range(0, cols, COLUMNS):
        c1 = min(cols, c0 + COLUMNS)
        part = _columns(source, whole, c0, c1)
        if k_blocks * block_size > rows:
            part = np.pad(part, ((0, k_blocks * block_size - rows), (0, 0)), "constant")
        p_packed, p_zero, p_scales = packed[c0:c1].copy(), zero_point[c0:c1].copy(), scales[c0:c1].copy()
        kernel(p_packed, part, p_scales, p_zero, block_size, c1 - c0, rows, symmetric)
        packed[c0:c1], zero_point[c0:c1], scales[c0:c1] = p_packed, p_zero, p_scales
    del whole
    inputs = [node.inputs[0], _initializer(graph, f"{weight.name}_Q{bits}", packed),
              _initializer(graph, f"{weight.name}_scales", scales)]
    if not symmetric:
        inputs.append(_initializer(graph, f"{weight.name}_zero_points", zero_point))
    attributes: dict[str, Any] = {"K": rows, "N": cols, "bits": bits, "block_size": block_size}
    if accuracy:
        attributes["accuracy_level"] = int(accuracy)
    _replace(graph, node, inputs, attributes, f"{node.name}_Q{bits}" if node.name else "", weight, source)
    return 1


COLUMNS = 4096
MADV_PAGEOUT = 21       # <sys/mman.h>, Linux 5.4+
M_MMAP_THRESHOLD = -3   # <malloc.h>
MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    except OSError:
        return None


def pin_malloc_threshold() -> bool:
    """Every allocation of MMAP_THRESHOLD_BYTES or more gets its own mapping (see the module docstring).
    False where this is not glibc on Linux (nothing changes there)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)


def checkpoint_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of .safetensors files."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n").endswith(".safetensors"):
                low, high = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((low, high))
    return ranges


def release_mapped_pages(tensor: Any) -> int:
    """Hand the whole pages under `tensor` back to the kernel when they lie in a mapping of a checkpoint
    file (see the module docstring); returns the bytes advised (0 for memory that is not such a mapping,
    which is never touched, or where the kernel refused)."""
    libc = _libc()
    if libc is None or tensor.numel() == 0:
        return 0
    start = int(tensor.data_ptr())
    extent = (sum((n - 1) * step for n, step in zip(tensor.shape, tensor.stride(), strict=True)) + 1)
    end = start + extent * tensor.element_size()
    page = mmap.PAGESIZE
    low, high = -(-start // page) * page, end // page * page  # whole pages only: neighbours keep theirs
    if high <= low or not any(a <= low and high <= b for a, b in checkpoint_mappings()):
        return 0
    if libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_PAGEOUT) != 0:
        return 0
    return int(high - low)


def _lazy_source(tensor: Any) -> Any:
    """The torch tensor a builder LazyTensor casts to fp32 when it is read (make_initializer's `to=` mode:
    the closure's `tensor`), when it is a 2-D floating torch tensor; else None (read the value whole)."""
    func = getattr(tensor, "_func", None)
    if func is None or getattr(tensor, "dtype", None) != _ir().DataType.FLOAT:
        return None
    if hasattr(func, "relctl_source"):  # wrapped by release_after_read
        return func.relctl_source
    if not func.__closure__:
        return None
    import torch  # noqa: PLC0415 - the builder's own dependency

    names = func.__code__.co_freevars
    cells = dict(zip(names, (c.cell_contents for c in func.__closure__), strict=True))
    source = cells.get("tensor")
    if isinstance(source, torch.Tensor) and source.dim() == 2 and source.is_floating_point() \
            and tuple(source.shape) == tuple(int(d) for d in tensor.shape):
        return source
    return None


def release_after_read(graph: Any) -> int:
    """Make every initializer the builder casts lazily from a checkpoint tensor hand that tensor's mapped
    pages back as soon as its fp32 copy is made (an fp32 build reads each weight once, when it is saved: the
    checkpoint's pages otherwise stay in this process's RSS to the end). Returns how many were wrapped."""
    wrapped = 0
    for value in graph.initializers.values():
        tensor = value.const_value
        source = _lazy_source(tensor) if tensor is not None else None
        if source is None:
            continue

        def read(func: Any = tensor._func, source: Any = source) -> Any:
            copied = func()
            release_mapped_pages(source)
            return copied

        read.__dict__["relctl_source"] = source  # read back by _lazy_source
        tensor._func = read
        wrapped += 1
    return wrapped


def place_int8(model: Any, int8_units: tuple[str, ...], int4_only_units: tuple[str, ...]) -> int:
    """Put MatMuls at int8 in an int4 build through the builder's own per-node bit table (the one its
    `matmul_mixed_precision` fills): those under `int8_units` (node-name prefixes such as /model/layers.1/),
    or every one NOT under `int4_only_units` (one unit alone at int4: precision: auto's per-layer
    sensitivity). Returns how many nodes were placed; the builder's to_nbits then quantizes them at 8 bits."""
    if not int8_units and not int4_only_units:
        return 0
    table = dict(getattr(model, "int4_customized_weight_config", None) or {})
    placed = 0
    for node in model.model.graph:
        if node.op_type != "MatMul" or not node.name:
            continue
        inside = any(node.name.startswith(p) for p in int8_units) or (
            bool(int4_only_units) and not any(node.name.startswith(p) for p in int4_only_units))
        if inside:
            table[node.name] = {"bits": 8}
            placed += 1
    model.int4_customized_weight_config = table
    print(f"relctl: {placed} MatMul weights placed at int8", flush=True)
    return placed


def take_unit_arguments(argv: list[str]) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """relctl's own --relctl_int8_units / --relctl_int4_only_units (comma-separated prefixes), removed from
    the builder's command line."""
    rest: list[str] = []
    found: dict[str, tuple[str, ...]] = {"--relctl_int8_units": (), "--relctl_int4_only_units": ()}
    items = iter(argv)
    for arg in items:
        if arg in found:
            found[arg] = tuple(p for p in next(items, "").split(",") if p)
        else:
            rest.append(arg)
    return rest, found["--relctl_int8_units"], found["--relctl_int4_only_units"]


def install(int8_units: tuple[str, ...] = (), int4_only_units: tuple[str, ...] = ()) -> None:
    """Route the builder's plain-case quantization through quantize_streaming. The builder imports its
    classes as the top-level `builders` package (onnxruntime_genai.models puts its folder on sys.path), a
    module object apart from onnxruntime_genai.models.builders: both are patched."""
    import importlib  # noqa: PLC0415

    import onnxruntime_genai.models  # noqa: PLC0415, F401 - puts the builder's folder on sys.path

    for module_name in ("builders.base", "onnxruntime_genai.models.builders.base"):
        model_class = importlib.import_module(module_name).Model
        original = model_class.to_nbits

        def to_nbits(self: Any, original: Any = original) -> Any:
            place_int8(self, int8_units, int4_only_units)
            return quantize_streaming(self) if _plain_case(self) else original(self)

        def save_model(self: Any, out_dir: str, original: Any = model_class.save_model) -> Any:
            wrapped = release_after_read(self.model.graph)
            print(f"relctl: {wrapped} weights hand their checkpoint pages back once read", flush=True)
            return original(self, out_dir)

        model_class.to_nbits = to_nbits
        model_class.save_model = save_model


def main() -> None:
    pin_malloc_threshold()
    argv, int8_units, int4_only_units = take_unit_arguments(sys.argv[1:])
    install(int8_units, int4_only_units)
    sys.argv = ["onnxruntime_genai.models.builder", *argv]
    try:
        runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
    finally:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        print(f"{PEAK_MARKER} {peak}", flush=True)


if __name__ == "__main__":
    main()
