"""Build llama.cpp once per machine: `python -m release.backends.llama_cpp.build` (what `make llama-cpp-env` runs).

The registry has no llama-cpp-python wheel, only its sdist, which vendors llama.cpp. This downloads the
pinned sdist with pip (the ordinary client, no other download), builds only `llama-server` and
`llama-quantize` with cmake (static, portable: no -march=native, so a copy works on any x86-64 host of
the same libc; no OpenSSL, no web UI fetched), and installs them with the converter and gguf-py into the
toolchain folder (release/backends/llama_cpp/toolchain.py). BUILT is written last, so an interrupted build
is resumed (cmake rebuilds only what is missing) and never mistaken for a whole one. A second run with
BUILT present does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from release.backends.llama_cpp.toolchain import BINARIES, LLAMA_CPP_PYTHON_VERSION, STAMP, build_record, home

SDIST = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
    # The server's web UI is not built and never fetched (the default downloads a prebuilt one).
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
)
# What the converter needs beside itself: its model classes and the gguf-py it writes with.
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")


def download_sdist(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        SDIST, "-d", str(folder)], check=True)
        found = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    return found[0]


def extract_vendored(sdist: Path, src: Path) -> None:
    """vendor/llama.cpp of the sdist into `src` (tarfile's data filter: no links or paths out of it)."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    staging = src.with_name(src.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            if member.name.startswith(prefix) and member.name != prefix:
                member.name = member.name[len(prefix):]
                members.append(member)
        archive.extractall(staging, members=members, filter="data")
    staging.rename(src)


def build(root: Path, jobs: int) -> dict[str, object]:
    src, build_dir = root / "src", root / "build"
    if not (src / "CMakeLists.txt").is_file():
        extract_vendored(download_sdist(root / "download"), src)
    started = time.monotonic()
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_FLAGS], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), f"-j{jobs}", "--target", *BINARIES], check=True)
    seconds = time.monotonic() - started
    (root / "bin").mkdir(exist_ok=True)
    for name in BINARIES:
        shutil.copy2(build_dir / "bin" / name, root / "bin" / name)
    convert = root / "convert"
    shutil.rmtree(convert, ignore_errors=True)
    convert.mkdir()
    for part in CONVERTER_PARTS:
        source = src / part
        if source.is_dir():
            shutil.copytree(source, convert / part)
        else:
            shutil.copy2(source, convert / part)
    record: dict[str, object] = {"llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "build_seconds": round(seconds, 1),
                                 "jobs": jobs, "cmake_flags": list(CMAKE_FLAGS)}
    (root / STAMP).write_text(json.dumps(record, indent=2) + "\n")
    # The sources and objects (~0.5 GB) are not needed to run: only bin/ and convert/ stay.
    shutil.rmtree(build_dir, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    return record


def main() -> int:
    root = home()
    done = build_record(root)
    if done is not None:
        print(f"llama.cpp {LLAMA_CPP_PYTHON_VERSION} already built in {root} ({done.get('build_seconds')} s)")
        return 0
    if shutil.which("cmake") is None:
        print("error: cmake is not installed\nhint: install cmake (3.14 or newer) and a C++17 compiler",
              file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    record = build(root, int(os.environ.get("RELCTL_LLAMA_CPP_JOBS", str(os.cpu_count() or 2))))
    print(f"llama.cpp {LLAMA_CPP_PYTHON_VERSION} built in {root} in {record['build_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
