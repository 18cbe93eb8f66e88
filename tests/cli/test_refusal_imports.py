"""A refusal that needs no registry and no model (a bad flag value, a bad or missing release.yaml) is answered
before MLflow, numpy or an engine is imported (issue 39: they took 15-28 s on a loaded machine against 0.9 s
for --help). The time itself is benchmarks/refusal_latency.py's; here, what the refusing process loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from release.core.errors import EXIT_BAD_INPUT

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("mlflow", "torch", "onnxruntime", "onnxruntime_genai", "onnx", "transformers", "pandas", "numpy")
PROBE = f"""
import json, sys
HEAVY = {HEAVY!r}
from release.cli import cli
try:
    cli(sys.argv[1:], standalone_mode=True)
except SystemExit as exc:
    code = exc.code
print(json.dumps(dict(code=code, loaded=[m for m in HEAVY if m in sys.modules])))
"""


@pytest.mark.parametrize(("yaml", "argv"), [
    ("convert:\n  precision: int4\n", ["promote", "0" * 32, "--precision", "int9"]),
    ("convert:\n  precision: int5\n", ["promote", "0" * 32]),
    ("convert:\n  precision: int5\n", ["check", "0" * 32]),
    ("convert:\n  precision: int4\n", ["promote", "0" * 32, "--config", "missing.yaml"]),
], ids=["bad-flag", "bad-yaml-promote", "bad-yaml-check", "missing-config"])
def test_a_refusal_loads_no_registry_client_and_no_engine(tmp_path: Path, yaml: str, argv: list[str]) -> None:
    (tmp_path / "release.yaml").write_text("model: m\n" + yaml)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["code"] == EXIT_BAD_INPUT, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("precision" in errors[0] or "no such config file" in errors[0]), done.stderr
    assert seen["loaded"] == [], seen
