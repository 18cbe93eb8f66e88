"""What a built package tells the memory plan: its config.json, the bytes of its ONNX initializers, its
precision, KV-cache dtype and execution provider, all read from the files, never assumed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from release.backends import backend_for_folder, backend_of
from release.core.errors import InputError
from release.core.package import MANIFEST, read_manifest
from release.memory.shape import PRECISIONS, Precision, Provider

_FLOAT_BYTES = {1: 4, 10: 2, 16: 2, 11: 8}  # onnx.TensorProto FLOAT, FLOAT16, BFLOAT16, DOUBLE


@dataclass(frozen=True)
class PackageFacts:
    """The measured side of a package: `weights_bytes` is the sum of its initializers (external data included)."""

    root: Path
    model_dir: Path
    config: dict[str, Any]
    weights_bytes: int
    precision: Precision
    kv_dtype_bytes: int
    provider: Provider
    backend: str = "onnxruntime-genai"  # the backend that built it: the memory plan is per engine


def read_package(path: Path) -> PackageFacts:
    """A relctl package (model/ + source/config.json) or a converted folder holding config.json."""
    if not path.exists():
        raise InputError(f"{path}: no such package or config.json", hint="pass a package folder or a config.json")
    model_dir = path / "model" if (path / "model").is_dir() else path
    config_path = next((p for p in (path / "source" / "config.json", model_dir / "config.json") if p.is_file()), None)
    if config_path is None:
        raise InputError(f"{path}: the package has no config.json (looked in source/ and model/)",
                         hint="rebuild it with relctl package, which copies the checkpoint's config.json "
                              "into source/")
    manifest = path / MANIFEST
    declared: str | None = None
    if manifest.is_file():
        package = read_manifest(path)
        backend, declared = backend_of(package), package.data.get("precision")
    else:
        backend = backend_for_folder(model_dir)
    # The backend reads its own files: initializer bytes of an ONNX graph, safetensors sizes, ...
    facts = backend.memory_facts(model_dir, declared)
    return PackageFacts(root=path, model_dir=model_dir, config=_read_config(config_path),
                        weights_bytes=facts.weights_bytes, precision=cast(Precision, facts.precision),
                        kv_dtype_bytes=facts.kv_dtype_bytes, provider=cast(Provider, facts.provider),
                        backend=backend.id)


def read_model_folder(model_dir: Path, config: dict[str, Any], precision: str | None = None,
                      root: Path | None = None) -> PackageFacts:
    """The facts of a converted folder whose config.json the caller already holds (e.g. before packaging)."""
    graph = _load_graph(model_dir)
    chosen = precision if precision in PRECISIONS else _graph_precision(graph)
    return PackageFacts(root=root or model_dir, model_dir=model_dir, config=config,
                        weights_bytes=initializer_bytes(graph), precision=cast(Precision, chosen),
                        kv_dtype_bytes=_kv_bytes(graph, model_dir), provider=_provider(model_dir))


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", hint="pass a Hugging Face config.json") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: top level is not an object", hint="pass a Hugging Face config.json")
    return data


def read_config_file(path: Path) -> dict[str, Any]:
    """A Hugging Face config.json given on its own (planning before anything is built)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="pass a package folder or a config.json")
    return _read_config(path)


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


def _provider(model_dir: Path) -> Provider:
    path = model_dir / "genai_config.json"
    if not path.is_file():
        return "cpu"
    options = json.loads(path.read_text()).get("model", {}).get("decoder", {}).get("session_options", {})
    providers = [name for entry in options.get("provider_options", []) for name in entry]
    return "cuda" if "cuda" in providers else "cpu"
