"""llama-server as relctl starts it: its command line, and one process on a private 127.0.0.1 port.

The argv is a plain function of the package and the slots wanted, so a deployment (KServe's container args,
release/backends/llama_cpp/deploy.py) and `relctl serve` start the same engine the same way:

- `--parallel N --kv-unified --ctx-size N x context`: N sequences decode at once (llama.cpp's own continuous
  batching) from one KV pool sized for N at the model's full context, so the pool is exactly the plan's
  (gguf_facts.kv_bytes_per_token x N x context);
- `--cache-ram 0`: no host-memory prompt cache beside the KV pool (its default is 8 GiB, which would make
  the process's memory depend on traffic rather than the plan);
- `--fit off`: the context is what relctl asks for, never shrunk to fit; `--no-webui`: an API, no UI.
"""

from __future__ import annotations

import os
from pathlib import Path

from release.backends.processes import EngineServer, engine_log_path

START_TIMEOUT_ENV = "RELCTL_LLAMA_CPP_START_TIMEOUT_S"
THREADS_ENV = "RELCTL_LLAMA_CPP_THREADS"


def server_argv(server: Path, gguf: Path, served_name: str, host: str, port: int, slots: int,
                context: int) -> list[str]:
    argv = [str(server), "--model", str(gguf), "--alias", served_name, "--host", host, "--port", str(port),
            "--parallel", str(slots), "--kv-unified", "--ctx-size", str(slots * context),
            "--cache-ram", "0", "--fit", "off", "--no-webui"]
    threads = os.environ.get(THREADS_ENV)
    if threads:
        argv += ["--threads", threads]
    return argv


def log_path(label: str, port: int) -> Path:
    return engine_log_path("llama-cpp", label, port)


class ServerProcess(EngineServer):
    """One llama-server, ready when /health answers 200 (it answers 503 while the model loads)."""

    name = "llama-server"
    start_timeout_env = START_TIMEOUT_ENV
    start_timeout_s = 300.0
