"""`relctl check` states the memory and disk a release will need (from config.json and the precision) and
refuses, with the numbers, when the machine cannot hold it: exit 2 before any slow stage. The memory case
runs relctl inside a real memory limit (tests/memlimit.py: a child group of the v1 cgroup memory
controller, made with mkdir, limited through memory.limit_in_bytes, entered by writing the child's pid to
cgroup.procs, removed with rmdir once empty), which relctl reads as the machine's memory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from release.backends.shape import parameter_count, shape_from_config
from release.cli import cli
from release.core.errors import EXIT_BAD_INPUT
from release.pipeline.resources import Machine, needs, shortfalls
from tests.conftest import load_train_module
from tests.memlimit import run_limited

pytestmark = pytest.mark.slow
RELCTL = [sys.executable, "-c", "from release.cli import main; main()"]
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
             "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def env() -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out.pop("MLFLOW_TRACKING_URI", None)
    return out


def test_an_8b_needs_its_bf16_bytes_and_a_small_disk_is_refused_with_numbers() -> None:
    need = needs(LLAMA3_8B, "int4", "cpu")
    assert need is not None
    assert need.checkpoint_bytes == 2 * parameter_count(shape_from_config(LLAMA3_8B)) == 16_060_522_496
    assert need.candidate_bytes < need.checkpoint_bytes / 2  # int4: a quarter of bf16, plus scales and fp32 embedding
    small = Machine(memory_bytes=64 << 30, memory_source="cgroup limit", disk_free_bytes=14 << 30, disk_path="/w")
    ((message, hint),) = shortfalls(need, small)
    assert "of disk" in message and "14.00 GiB free" in message and "relctl gc" in hint
    assert not shortfalls(need, Machine(64 << 30, "MemAvailable", 1 << 40, "/w"))
    # Disk: the measured peak is checkpoint + candidate (benchmarks/scaling.py); the prediction stays within
    # the 1.2x of it, and a merged LoRA adds one checkpoint-sized copy.
    pair = need.checkpoint_bytes + need.candidate_bytes
    assert pair < need.disk_bytes <= 1.2 * pair
    merging = needs(LLAMA3_8B, "int4", "cpu", merges_adapter=True)
    assert merging is not None and merging.disk_bytes - need.disk_bytes >= need.checkpoint_bytes


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> tuple[Path, str]:
    project = tmp_path_factory.mktemp("resources")
    (project / "release.yaml").write_text("model: tiny-llm\nconvert:\n  precision: int4\n")
    return project, load_train_module().log_run(tiny_run, project, experiment="tiny-llm")


def test_check_states_the_needs(project: tuple[Path, str]) -> None:
    folder, run = project
    result = CliRunner().invoke(cli, ["--project-dir", str(folder), "check", run, "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    need = json.loads(result.stdout)["needs"]
    assert need["precision"] == "int4" and need["memory_bytes"] > need["checkpoint_bytes"] > 0
    # The example's run logs a LoRA adapter: its merge is a second checkpoint-sized copy.
    assert need["disk_bytes"] >= 2 * need["checkpoint_bytes"] + need["candidate_bytes"]
    text = CliRunner().invoke(cli, ["--project-dir", str(folder), "check", run])
    assert "the release needs about" in text.stdout and "of memory" in text.stdout


def test_inside_a_memory_limit_too_small_check_and_promote_refuse_before_any_stage(project: tuple[Path, str]) -> None:
    folder, run = project
    limit = 700 << 20  # room for relctl itself, not for the release (the tiny model needs over 1 GiB)
    for command in (["check", run], ["promote", run]):
        done = run_limited([*RELCTL, "--project-dir", str(folder), *command], limit, env=env(), timeout_s=300)
        assert not done.killed, done.stderr
        assert done.returncode == EXIT_BAD_INPUT, done.stdout + done.stderr
        assert "of memory and the machine has 700.00 MiB (734,003,200 bytes, cgroup limit)" in done.stderr, done.stderr
    assert not (folder / ".relctl" / "work").exists()  # no stage started
