"""The validate stage's serving-memory estimate from the `serving:` block (kept for promote; the richer
plan is release.memory.verdict.make_plan).

Per replica: weights + KV cache + workspace, where
    KV cache  = 2 (K and V) x layers x kv_heads x head_dim x bytes per element x concurrency x context_tokens
                (MLA: layers x (kv_lora_rank + qk_rope_head_dim); a layer with a window-bounded cache holds at
                most its window; an architecture the plan does not know is refused: release/memory/families.py)
    workspace = workspace_fraction x (weights + KV cache)
A rolling update runs `rollout_replicas` replicas side by side on the accelerator, so the peak the plan
must fit is per_replica x rollout_replicas; the headroom is what is left of `gpu_memory_gib` at that peak.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from release.config import ServingConfig
from release.core.errors import InputError
from release.core.package import missing_runtime
from release.memory.families import DEFAULT_HEAD_DIM, check_supported, sliding_layers

GIB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """All sizes in bytes. `max_concurrency` is the most concurrent sequences that still fit at the peak."""

    weights_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    workspace_bytes: int
    per_replica_bytes: int
    rollout_replicas: int
    peak_bytes: int
    capacity_bytes: int
    headroom_bytes: int
    fits: bool
    max_concurrency: int
    concurrency: int
    context_tokens: int

    @property
    def headroom_fraction(self) -> float:
        return self.headroom_bytes / self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["headroom_fraction"] = round(self.headroom_fraction, 6)
        data["peak_gib"] = round(self.peak_bytes / GIB, 4)
        data["capacity_gib"] = round(self.capacity_bytes / GIB, 4)
        return data


@dataclass(frozen=True)
class MemoryMeasurement:
    """A real GPU measurement, or `peak_bytes=None` and the reason none could be taken."""

    peak_bytes: int | None
    reason: str
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_geometry(config: dict[str, Any]) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) from an HF config.json; InputError naming a missing field."""
    layers = first_int(config, ("num_hidden_layers", "n_layer", "num_layers"))
    heads = first_int(config, ("num_attention_heads", "n_head"))
    kv_heads = first_int(config, ("num_key_value_heads",), default=heads)
    head_dim = config.get("head_dim")
    if not isinstance(head_dim, int) or head_dim <= 0:
        hidden = first_int(config, ("hidden_size", "n_embd"))
        head_dim = hidden // heads
    return layers, kv_heads, head_dim


def kv_layout(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(layers, cached elements per token per layer, window, layers whose cache the window bounds) of a config whose
    architecture the plan knows; InputError naming a missing field or saying 'unsupported architecture'."""
    layers, kv_heads, head_dim = kv_geometry(config)
    family = check_supported(config)
    if family in ("deepseek_v2", "deepseek_v3"):
        elements = first_int(config, ("kv_lora_rank",)) + first_int(config, ("qk_rope_head_dim",))
    else:
        if not isinstance(config.get("head_dim"), int) and family in DEFAULT_HEAD_DIM:
            head_dim = DEFAULT_HEAD_DIM[family]
        elements = 2 * kv_heads * head_dim
    window, _, bounded = sliding_layers(config, family, layers)
    return layers, elements, window, bounded


def first_int(config: dict[str, Any], keys: tuple[str, ...], default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    if default is not None:
        return default
    raise InputError(
        f"config.json: no positive integer '{keys[0]}'",
        hint="the memory estimate needs the model's layer and attention-head counts from config.json",
    )


def estimate_memory(
    config: dict[str, Any], weights_bytes: int, serving: ServingConfig, kv_dtype_bytes: int
) -> MemoryEstimate:
    """Weights + KV cache at the planned concurrency and context + workspace, x rollout replicas."""
    if weights_bytes < 0:
        raise InputError(f"weights_bytes: {weights_bytes} is negative", hint="pass the size of the model files")
    if kv_dtype_bytes not in (1, 2, 4):
        raise InputError(f"kv_dtype_bytes: {kv_dtype_bytes} is not 1, 2 or 4", hint="fp16 KV is 2, fp32 is 4")
    layers, elements, window, windowed = kv_layout(config)
    per_token = layers * elements * kv_dtype_bytes
    context = serving.context_tokens
    per_sequence = elements * kv_dtype_bytes * ((layers - windowed) * context + windowed * min(context, window))
    kv = per_sequence * serving.concurrency
    workspace = math.ceil(serving.workspace_fraction * (weights_bytes + kv))
    per_replica = weights_bytes + kv + workspace
    peak = per_replica * serving.rollout_replicas
    capacity = int(serving.gpu_memory_gib * GIB)
    return MemoryEstimate(
        weights_bytes=weights_bytes,
        kv_cache_bytes=kv,
        kv_bytes_per_token=per_token,
        workspace_bytes=workspace,
        per_replica_bytes=per_replica,
        rollout_replicas=serving.rollout_replicas,
        peak_bytes=peak,
        capacity_bytes=capacity,
        headroom_bytes=capacity - peak,
        fits=peak <= capacity,
        max_concurrency=max_concurrency(capacity, weights_bytes, per_sequence, serving),
        concurrency=serving.concurrency,
        context_tokens=serving.context_tokens,
    )


def max_concurrency(capacity: int, weights: int, per_sequence: int, serving: ServingConfig) -> int:
    """Largest c with rollout x (1 + workspace) x (weights + per_sequence x c) <= capacity (per_sequence: one
    sequence's KV cache at the context)."""
    per_replica_budget = capacity / (serving.rollout_replicas * (1 + serving.workspace_fraction))
    if per_sequence == 0:
        return 0
    return max(0, math.floor((per_replica_budget - weights) / per_sequence))


def folder_weights_bytes(model_dir: Path) -> int:
    """Bytes of the ONNX graph and its external data in a converted folder (what a replica loads)."""
    return sum(p.stat().st_size for p in model_dir.iterdir() if p.name.endswith((".onnx", ".onnx.data")))


def folder_kv_dtype_bytes(model_dir: Path) -> int:
    """Bytes per KV-cache element of a converted genai folder, read from its graph's past_key_values inputs."""
    import onnx  # noqa: PLC0415 - the estimate from config alone must not load onnx

    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    sizes = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.BFLOAT16: 2}
    for graph_input in graph.input:
        if graph_input.name.startswith("past_key_values"):
            elem_type = graph_input.type.tensor_type.elem_type
            if elem_type in sizes:
                return sizes[elem_type]
    raise InputError(
        f"{model_dir.name}: model.onnx has no float past_key_values input",
        hint="the memory estimate needs an onnxruntime-genai decoder folder (convert with the genai exporter)",
    )


def measure_memory(model_dir: Path, serving: ServingConfig) -> MemoryMeasurement:
    """GPU memory this process uses after loading `model_dir` on CUDA and generating a full batch, through the
    backend that built the folder.

    Needs a CUDA build of that backend's engine and an NVIDIA GPU; anywhere else it returns peak_bytes=None
    with the reason, and the estimate is the only memory evidence.
    """
    import os  # noqa: PLC0415 - kept beside the CUDA-only path it serves

    from release.backends import backend_for_folder  # noqa: PLC0415 - entry points, only when measured

    backend = backend_for_folder(model_dir)
    missing_runtime(backend, model_dir, model_dir.name)
    if shutil.which("nvidia-smi") is None:
        return MemoryMeasurement(None, "no NVIDIA GPU on this host (nvidia-smi not found); estimate only")
    probe = backend.batch_probe(model_dir, "cuda")
    if probe is None:
        return MemoryMeasurement(None, f"the {backend.id} backend cannot run on CUDA here (for onnxruntime-genai: "
                                       "install onnxruntime-genai-cuda)")
    # A full batch at the planned context length: the KV cache is allocated for max_length up front.
    probe.run(serving.concurrency, serving.context_tokens, 8, 1)
    used = _process_gpu_bytes(os.getpid())
    probe.close()
    if used is None:
        return MemoryMeasurement(None, "nvidia-smi did not report this process's memory", device="cuda")
    return MemoryMeasurement(used, "measured with nvidia-smi after load + one batched step", device="cuda")


def _process_gpu_bytes(pid: int) -> int | None:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout
    total = sum(int(mib) * 1024 * 1024 for p, mib in (ln.split(",") for ln in out.splitlines() if "," in ln)
                if p.strip() == str(pid))
    return total or None
