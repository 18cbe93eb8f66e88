"""Packages for the memory tests: one small random Llama, built with onnxruntime-genai's builder at
fp32, int8 and int4 (cpu) once per session, each a relctl package with source/config.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.tinymodel import build_hf_model


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from release.backends import backend_for_folder
    from release.core.package import build_package

    root = tmp_path_factory.mktemp("memory-models")
    hf = build_hf_model(root / "hf", hidden=128, layers=2)
    out: dict[str, Path] = {}
    for precision in ("fp32", "int8", "int4"):
        genai = root / f"genai-{precision}"
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(genai),
               "-p", precision, "-e", "cpu", "-c", str(root / "cache")]
        subprocess.run(cmd, capture_output=True, check=True)
        fields = {"model_name": "mem", "precision": precision, "exporter": "genai", "lineage": {}, "serving": {}}
        package = build_package(root / f"pkg-{precision}", genai, hf, fields, backend_for_folder(genai))
        out[precision] = package.root
    return out
