from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from release.serving.process import ServerProcess
from tests.serving.tinymodel import build_tiny_package


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A relctl package of a small random Llama (genai fp32), built once per session.

    Sized so a 1,000-token stream takes on the order of a second even on an idle machine: the
    overload, timeout, disconnect and shutdown tests need requests that are still running when they act.
    """
    return build_tiny_package(tmp_path_factory.mktemp("tiny-serving"), hidden=256, layers=4)


def write_server_config(path: Path, **server: object) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"serving": {"server": server}}))
    return path


@pytest.fixture(scope="module")
def server(tiny_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`relctl serve` on the tiny package, one per test module, small queue so overload is reachable."""
    work = tmp_path_factory.mktemp("server")
    config = write_server_config(work / "release.yaml", workers=2, queue_size=4, max_prompt_tokens=256,
                                 max_output_tokens=1024, request_timeout_s=30)
    with ServerProcess(str(tiny_package), work, config=config) as proc:
        yield proc


@pytest.fixture(scope="module")
def delay_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tests/serving/delay_server.py in its own process; yields its base URL."""
    import json
    import subprocess
    import sys
    import time

    ready = tmp_path_factory.mktemp("delay") / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "tests.serving.delay_server", "--ready-file", str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "delay server did not start"
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="session")
def trained_package(tmp_path_factory: pytest.TempPathFactory, tiny_base_only: Path) -> Path:
    """The shared trained tiny Llama, converted by release.stages.convert (fp32) and packaged."""
    from release.backends import backend_for_folder
    from release.core.package import build_package
    from release.stages.convert import convert

    root = tmp_path_factory.mktemp("trained-serving")
    converted = convert(tiny_base_only, root / "onnx", "fp32")
    fields = {"model_name": "tiny-llm", "precision": "fp32", "exporter": converted.backend,
              "lineage": {"checkpoint": str(tiny_base_only)}, "serving": {}}
    build_package(root / "package", converted.out_dir, tiny_base_only, fields,
                  backend_for_folder(converted.out_dir))
    return root / "package"
