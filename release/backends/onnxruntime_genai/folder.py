"""What an onnxruntime-genai folder tells the memory plan: the bytes of its ONNX initializers, its precision
(MatMulNBits bits, or the float type most initializers hold), its KV-cache dtype (the past_key_values
inputs) and the execution provider genai_config.json names, all read from the files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from release.backends.base import MemoryFacts
from release.backends.onnxruntime_genai import provider_of
from release.backends.shape import PRECISIONS
from release.core.errors import InputError

_FLOAT_BYTES = {1: 4, 10: 2, 16: 2, 11: 8}  # onnx.TensorProto FLOAT, FLOAT16, BFLOAT16, DOUBLE


def read_model_folder(model_dir: Path, precision: str | None = None) -> MemoryFacts:
    """The memory facts of a built folder (`precision`: the package's declared one, else read from the graph)."""
    graph = _load_graph(model_dir)
    chosen = precision if precision in PRECISIONS else _graph_precision(graph)
    return MemoryFacts(weights_bytes=initializer_bytes(graph), kv_dtype_bytes=_kv_bytes(graph, model_dir),
                       precision=chosen, provider=built_for(model_dir))


def _load_graph(model_dir: Path) -> Any:
    return onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph


def initializer_bytes(graph: Any) -> int:
    """Bytes of every initializer: the external-data length when stored outside, else the tensor's own data."""
    total = 0
    for tensor in graph.initializer:
        external = {entry.key: entry.value for entry in tensor.external_data}
        if "length" in external:
            total += int(external["length"])
        elif tensor.raw_data:
            total += len(tensor.raw_data)
        else:
            count = int(np.prod(tensor.dims)) if tensor.dims else 1
            total += count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return total


def _graph_precision(graph: Any) -> str:
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
            return "int8" if bits == 8 else "int4"
    floats = [t.data_type for t in graph.initializer if t.data_type in _FLOAT_BYTES]
    return "fp16" if floats and max(set(floats), key=floats.count) == 10 else "fp32"


def _kv_bytes(graph: Any, model_dir: Path) -> int:
    for graph_input in graph.input:
        if graph_input.name.startswith("past_key_values"):
            size = _FLOAT_BYTES.get(graph_input.type.tensor_type.elem_type)
            if size is not None:
                return size
    raise InputError(f"{model_dir.name}: model.onnx has no float past_key_values input",
                     hint="the memory plan needs an onnxruntime-genai decoder (convert with the genai exporter)")


def built_for(model_dir: Path) -> str:
    """The execution provider the folder was built for, as genai_config.json names it."""
    path = model_dir / "genai_config.json"
    if not path.is_file():
        return "cpu"
    from release.core.jsonfile import load_json_object  # noqa: PLC0415

    return provider_of(load_json_object(path, hint="rebuild the folder with relctl convert"))
