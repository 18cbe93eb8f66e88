"""The GPU environment: exactly one ONNX Runtime build, and the CUDA provider really in use.

onnxruntime and onnxruntime-gpu install into the same `onnxruntime` import package; with both present the
last one installed wins file by file and the CUDA provider may silently be missing. relctl refuses that
environment instead of measuring the wrong thing.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from release.core.errors import InputError

_ORT_BUILDS = ("onnxruntime", "onnxruntime-gpu")
_GENAI_BUILDS = ("onnxruntime-genai", "onnxruntime-genai-cuda")


def installed(names: tuple[str, ...]) -> dict[str, str]:
    """The distributions among `names` that are installed, with their versions."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def check_ort_builds() -> None:
    """InputError (exit 2) when the environment holds both the CPU and the GPU build of ONNX Runtime (or genai)."""
    for builds in (_ORT_BUILDS, _GENAI_BUILDS):
        found = installed(builds)
        if len(found) > 1:
            listed = " and ".join(f"{n} {v}" for n, v in found.items())
            raise InputError(f"environment holds both {listed}; they overwrite each other's files",
                             hint=f"pip uninstall -y {' '.join(found)}, then install only {builds[1]} "
                                  "(pip install 'relctl[gpu]' on a GPU host)")


def session_providers(model_file: Path) -> list[str]:
    """The providers an InferenceSession asked for CUDA actually runs with (never the available list)."""
    import onnxruntime as ort  # noqa: PLC0415 - only on the CUDA path; the ORT check above must run first

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_file), options,
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    return list(session.get_providers())


def require_cuda(model_file: Path) -> None:
    """InputError unless a session on `model_file` really runs on the CUDA provider."""
    check_ort_builds()
    used = session_providers(model_file)
    if not used or used[0] != "CUDAExecutionProvider":
        raise InputError(f"{model_file.name}: the session runs on {used}, not CUDAExecutionProvider",
                         hint="install onnxruntime-gpu with its CUDA 12 and cuDNN 9 libraries "
                              "(pip install 'onnxruntime-gpu[cuda,cudnn]') and check nvidia-smi")


def main() -> None:
    """`python -m release.backends.onnxruntime_genai.gpu_env`: exit 2 with one error line when the environment
    mixes ONNX Runtime builds."""
    try:
        check_ort_builds()
    except InputError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        print(f"hint: {exc.hint}", file=sys.stderr)
        raise SystemExit(2) from exc
    builds = installed(_ORT_BUILDS + _GENAI_BUILDS)
    print("ok: one ONNX Runtime build: " + ", ".join(f"{n} {v}" for n, v in builds.items()))


if __name__ == "__main__":
    main()
