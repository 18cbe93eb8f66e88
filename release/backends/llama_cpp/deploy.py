"""What a deployment of a GGUF package runs: llama.cpp's own server image and its container, as plain data
(KServe keeps engines as data: a serving runtime is a container and its args).

`relctl render kserve` does not read this yet (its manifest choice is made outside the backends): the
container below is what a llama-cpp InferenceService's predictor runs once it does, with relctl's pull init
container writing the verified package to /mnt/models/package as for the other engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from release.backends.llama_cpp.gguf_facts import GGUF_FILE
from release.backends.llama_cpp.server import server_argv

# llama.cpp's published server image (CPU build; `:server-cuda` for NVIDIA GPUs). Its entrypoint is
# /app/llama-server, so the container's args are llama-server's own.
IMAGE = "ghcr.io/ggml-org/llama.cpp:server"
CUDA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"
PACKAGE_MOUNT = Path("/mnt/models/package")
PORT = 8080


def container_args(served_name: str, slots: int, context: int, port: int = PORT) -> list[str]:
    """llama-server's args in the image: the same flags `relctl serve` starts it with (server.server_argv)."""
    return server_argv(Path("llama-server"), PACKAGE_MOUNT / "model" / GGUF_FILE, served_name, "0.0.0.0", port,
                       slots, context)[1:]


def kserve_container(served_name: str, slots: int, context: int, memory_bytes: int, cpu: str = "2",
                     gpus: int = 0) -> dict[str, Any]:
    """The predictor container of a llama-cpp InferenceService (KServe v1beta1 `containers[0]`)."""
    args = container_args(served_name, slots, context)
    if gpus:
        args += ["--n-gpu-layers", "999"]  # every layer on the GPU (the CUDA image's build)
    memory = f"{max(1, -(-memory_bytes // 2**20))}Mi"
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "name": "kserve-container",
        "image": CUDA_IMAGE if gpus else IMAGE,
        "args": args,
        "ports": [{"containerPort": PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(limits), "limits": limits},
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}},
        "volumeMounts": [{"name": "relctl-models", "mountPath": str(PACKAGE_MOUNT.parent), "readOnly": True}],
    }
