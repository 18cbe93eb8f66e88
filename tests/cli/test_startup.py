"""`relctl --help` and every subcommand's `--help` start without the heavy stack.

Each help runs in a fresh interpreter (the test process itself has imported everything by now), which then
prints the top-level packages it loaded. The command table is read from the CLI itself, so a command added
later is covered without editing this file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Seconds of start-up each costs (python -X importtime on the reference machine): mlflow ~2, scipy.stats ~1,
# onnx ~0.6 (ml_dtypes), torch ~2, matplotlib ~0.3; aiohttp, starlette and uvicorn 0.1-0.2 each.
HEAVY = ("mlflow", "onnx", "onnxruntime", "onnxruntime_genai", "torch", "transformers", "scipy", "matplotlib",
         "pandas", "great_expectations", "aiohttp", "starlette", "uvicorn", "sqlalchemy")

# Runs `relctl ARGS...` in this interpreter the way the console script does, then reports sys.modules.
PROBE = """
import json, sys
from release.cli import cli
try:
    cli.main(args=sys.argv[1:], prog_name="relctl")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("MODULES=" + json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
sys.exit(code)
"""


def command_paths() -> list[list[str]]:
    """Every command of the relctl group, nested groups included (bench run, render kserve, ...)."""
    from release.cli import cli

    paths: list[list[str]] = []

    def walk(group: click.Group, prefix: list[str]) -> None:
        for name, command in sorted(group.commands.items()):
            paths.append([*prefix, name])
            if isinstance(command, click.Group):
                walk(command, [*prefix, name])

    walk(cli, [])
    return paths


def loaded_by(args: list[str]) -> tuple[str, set[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES="))
    return proc.stdout, set(json.loads(line.removeprefix("MODULES=")))


def test_every_command_is_covered() -> None:
    names = {" ".join(p) for p in command_paths()}
    # The table really was walked: the commands a newcomer meets first, and a nested one.
    assert {"promote", "status", "history", "trace", "check", "canary", "plan", "bench run"} <= names


@pytest.mark.parametrize("args", [[], *command_paths()], ids=lambda a: " ".join(a) or "relctl")
def test_help_loads_no_heavy_module(args: list[str]) -> None:
    out, modules = loaded_by([*args, "--help"])
    assert "Usage: relctl" in out
    assert not modules & set(HEAVY), f"relctl {' '.join(args)} --help imported {sorted(modules & set(HEAVY))}"
