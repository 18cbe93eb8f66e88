"""`relctl ... | head`: a reader that stops early ends every command quietly with exit 0, as git does.

The read end of stdout's pipe is closed before relctl starts, so its first write meets EPIPE
deterministically (no race with how fast `head` exits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RELCTL = str(Path(sys.executable).with_name("relctl"))
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
         "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}

PLAN = ["plan", "--gpu", "H100-80GB", "--concurrency", "8", "--context", "4096"]


def into_closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([RELCTL, *args], stdout=write, stderr=subprocess.PIPE, text=True, cwd=cwd,
                              timeout=120, check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [
    [*PLAN, "config.json"],                              # a command's body (the case)
    [*PLAN, "config.json", "--json"],
    ["backends"],                                        # another command
    ["--help"],                                          # click's own output, before any command runs
], ids=["plan", "plan-json", "backends", "help"])
def test_a_closed_stdout_ends_quietly_with_exit_0(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    result = into_closed_pipe(args, tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


def test_an_error_is_still_an_error_when_stdout_is_closed(tmp_path: Path) -> None:
    result = into_closed_pipe([*PLAN, "missing.json"], tmp_path)
    assert result.returncode == 2 and "error:" in result.stderr and "relctl bug" not in result.stderr
