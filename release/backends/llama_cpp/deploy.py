"""What a deployment of a GGUF package runs (`Backend.deployment`, read by `relctl render kserve`): llama.cpp's
own server image, with the args `relctl serve` starts llama-server with (server.server_argv) and the KV pool
and memory its release's plan recorded.

The InferenceService is this package's template (kserve-llama-cpp-inferenceservice.yaml): relctl's init
container pulls and verifies the package into /mnt/models/package, then llama-server (the image's entrypoint)
serves model/model.gguf. Slots and pool are the plan's: `--parallel` the planned concurrency
(`memory.concurrency`), `--ctx-size` the KV cells the plan sized (`memory.kv_capacity_tokens`, llama.cpp's
256-cell step included); with --kv-unified the slots share that one pool, each up to the model's context.
A release without those figures gets the pool split into slots of the model's full context.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from release.backends.base import Deployment
from release.backends.llama_cpp.gguf_facts import GGUF_FILE
from release.backends.llama_cpp.memory import kv_cells
from release.backends.llama_cpp.server import server_argv

# llama.cpp's published server images (CPU; CUDA). Their entrypoint is /app/llama-server, so the container's
# args are llama-server's own.
IMAGE = "ghcr.io/ggml-org/llama.cpp:server"
CUDA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"
TEMPLATE = Path(__file__).with_name("kserve-llama-cpp-inferenceservice.yaml")
PACKAGE_MOUNT = Path("/mnt/models/package")
PORT = 8080
# A pod's memory beyond the plan's replica: the page cache of the memory-mapped GGUF being read and the
# allocator's slack (the plan counts the weights once). A limit that is too tight is an OOM kill mid-traffic.
POD_MARGIN_BYTES = 64 * 1024**2
CONTEXT_FILE = "source/config.json"


def container_args(served_name: str, slots: int, context: int, port: int = PORT) -> list[str]:
    """llama-server's args in the image: the same flags `relctl serve` starts it with (server.server_argv)."""
    return server_argv(Path("llama-server"), PACKAGE_MOUNT / "model" / GGUF_FILE, served_name, "0.0.0.0", port,
                       slots, context)[1:]


def slots_for(pool_cells: int | None, context: int) -> int:
    """The sequences of `context` tokens the plan's KV pool holds (at least one)."""
    return max(1, (pool_cells or context) // context)


def deployment(files: dict[str, dict[str, Any]], memory: dict[str, float], device: str | None) -> Deployment:
    config = files.get(CONTEXT_FILE, {})
    context = config.get("max_position_embeddings")
    device = device or "cpu"
    args: list[str] = []
    if isinstance(context, int) and context > 0:
        cells = memory.get("kv_capacity_tokens")
        slots = slots_for(int(cells) if cells else None, context)
        # --ctx-size is slots x context as relctl serve starts it; llama.cpp rounds it to 256 cells itself.
        # The template sets --model, --alias, --host and --port; the rest is what relctl serve passes.
        args = container_args("model", slots, context)[8:]
        args[args.index("--ctx-size") + 1] = str(kv_cells(slots * context))
    if device == "cuda":
        args += ["--n-gpu-layers", "999"]  # every layer on the GPU (the CUDA image's build)
    per_replica = memory.get("per_replica_bytes")
    return Deployment(validated_device="cpu", template=str(TEMPLATE), runs_on=("cpu", "cuda"), own_engine=True,
                      engine_image=CUDA_IMAGE if device == "cuda" else IMAGE, args=tuple(args),
                      memory_bytes=math.ceil(per_replica) + POD_MARGIN_BYTES if per_replica else None,
                      init_verifies=True)
