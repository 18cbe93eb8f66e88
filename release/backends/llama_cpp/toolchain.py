"""Where llama.cpp's built tools live on this machine, and how relctl finds them.

llama.cpp is not a Python wheel here: the registry has only llama-cpp-python's sdist, which vendors
llama.cpp (its `llama-server`, `llama-quantize`, `convert_hf_to_gguf.py` and `gguf-py`). `make
llama-cpp-env` (release/backends/llama_cpp/build.py) builds the two binaries once per machine and keeps
them, with the converter and gguf-py, in one folder keyed by that version, outside any checkout, so CI on
the same machine never rebuilds them:

    $RELCTL_LLAMA_CPP_HOME (default ~/.cache/relctl/llama.cpp-<version>/)
        bin/llama-server, bin/llama-quantize
        convert/convert_hf_to_gguf.py, convert/conversion/, convert/gguf-py/
        BUILT                        written last: the build is whole (its seconds and flags inside)
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from release.core.errors import ConfigError, InputError

# The llama-cpp-python sdist whose vendored llama.cpp is built: its version names the build everywhere
# (manifests, the cache folder, the serving image's documentation).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
HOME_ENV = "RELCTL_LLAMA_CPP_HOME"
STAMP = "BUILT"
BINARIES = ("llama-server", "llama-quantize")
MAKE_HINT = f"run `make llama-cpp-env` (builds llama.cpp once per machine), or set {HOME_ENV} to a built copy"


_from_config: str | None = None  # the home `convert.llama-cpp.home` set in this process (not the user's own)


def configure_home(value: str, base_dir: Path, label: str) -> None:
    """release.yaml's `convert.llama-cpp.home` (relative to `base_dir`, release.yaml's folder): checked now,
    when the file is loaded (a folder without a whole build is refused, naming `make llama-cpp-env`), and
    exported as RELCTL_LLAMA_CPP_HOME so the `relctl serve` processes the gates start find the same build.
    A RELCTL_LLAMA_CPP_HOME the user set wins, unchecked here (target_problem checks it)."""
    global _from_config  # one setting per process, as the environment variable is
    given = os.environ.get(HOME_ENV)
    if given and given != _from_config:
        return
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if build_record(path) is None:
        raise ConfigError(f"{label}: convert.llama-cpp.home: {path}: no llama.cpp build there (no {STAMP} file)",
                          hint=f"run `make llama-cpp-env` with {HOME_ENV}={path}, or fix the path (relative to "
                               f"{label}'s folder)")
    _from_config = os.environ[HOME_ENV] = str(path.absolute())


def home() -> Path:
    """The toolchain folder: RELCTL_LLAMA_CPP_HOME, else the per-user cache keyed by version."""
    given = os.environ.get(HOME_ENV)
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "relctl" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def build_record(root: Path | None = None) -> dict[str, Any] | None:
    """What the build wrote into BUILT (seconds, cmake flags), or None when there is no whole build."""
    stamp = (root or home()) / STAMP
    if not stamp.is_file():
        return None
    try:
        record: dict[str, Any] = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record


def missing() -> str | None:
    """Why the toolchain cannot be used, or None: checked by `target_problem`, before anything slow."""
    root = home()
    if build_record(root) is None:
        return f"llama.cpp is not built in {root} (no {STAMP} file)"
    for name in BINARIES:
        if not (root / "bin" / name).is_file():
            return f"{root / 'bin' / name}: missing from the llama.cpp build"
    if not converter_script(root).is_file():
        return f"{converter_script(root)}: missing from the llama.cpp build"
    return None


def require() -> Path:
    """The toolchain folder; InputError naming `make llama-cpp-env` when it is not built."""
    problem = missing()
    if problem is not None:
        raise InputError(problem, hint=MAKE_HINT)
    return home()


def binary(name: str) -> Path:
    return require() / "bin" / name


def converter_dir(root: Path | None = None) -> Path:
    return (root or home()) / "convert"


def converter_script(root: Path | None = None) -> Path:
    return converter_dir(root) / "convert_hf_to_gguf.py"


def gguf_module() -> ModuleType:
    """llama.cpp's own gguf-py (the version its converter writes with: 0.19.0 in 0.3.36, the same as PyPI's
    `gguf` 0.19.0), imported from the build so relctl's environment needs no second copy."""
    if "gguf" not in sys.modules:
        path = str(require() / "convert" / "gguf-py")
        if path not in sys.path:
            sys.path.append(path)
    return importlib.import_module("gguf")  # found on the build's path, only when a GGUF file is read
