"""A runner whose memory limit is exactly the need `relctl check` reports is accepted, though the kernel
stores the limit rounded down to a 4 KiB page (issue 39: such a runner was refused, the message printing
both figures as the same "9.97 GiB"); a limit a page short of that is refused with the exact byte figures.

The comparison is checked on its own, then through a real limit: a child group of the v1 cgroup memory
controller (tests/memlimit.py) whose memory.limit_in_bytes is written as the reported need, read back by a
relctl process inside it as its machine's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from release.pipeline.resources import PAGE, Machine, Needs, needs, page_floor, shortfalls
from tests.memlimit import MemoryGroup, available

ROOT = Path(__file__).resolve().parents[2]
# A Qwen2.5-0.5B-shaped config: an int4 need of 1.6 GB, not a whole number of pages.
QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
            "torch_dtype": "bfloat16", "tie_word_embeddings": True}
DISK = 1 << 50


def reported_need() -> Needs:
    need = needs(QWEN_05B, "int4", "cpu")
    assert need is not None
    assert need.memory_bytes % PAGE != 0  # otherwise the kernel's rounding would change nothing
    return need


def test_a_limit_equal_to_the_need_rounded_down_to_a_page_is_accepted() -> None:
    need = reported_need()
    assert not shortfalls(need, Machine(page_floor(need.memory_bytes), "cgroup limit", DISK, "/w"))
    assert not shortfalls(need, Machine(need.memory_bytes, "cgroup limit", DISK, "/w"))


def test_a_page_short_is_refused_with_the_exact_bytes() -> None:
    need = reported_need()
    have = page_floor(need.memory_bytes) - PAGE
    ((message, hint),) = shortfalls(need, Machine(have, "cgroup limit", DISK, "/w"))
    # The rounded sizes read the same; the byte figures tell them apart.
    assert f"{need.memory_bytes:,} bytes" in message and f"{have:,} bytes, cgroup limit" in message
    assert f"{page_floor(need.memory_bytes):,} bytes or more is enough" in message
    assert "more memory" in hint


CHILD = """
import json
from release.pipeline.resources import machine, needs, shortfalls
from tests.limits.test_page_rounding import QWEN_05B
from pathlib import Path
have = machine(Path("."))
print(json.dumps({"memory": have.memory_bytes, "source": have.memory_source,
                  "problems": shortfalls(needs(QWEN_05B, "int4", "cpu"), have)}))
"""


def test_inside_a_real_cgroup_limit_set_to_the_reported_need_the_release_is_accepted() -> None:
    # Runs, never skips: this machine and CI's have the v1 memory controller (as tests/limits' other tests use).
    assert available() is None, available()
    need = reported_need()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for limit, accepted in ((need.memory_bytes, True), (page_floor(need.memory_bytes) - PAGE, False)):
        with MemoryGroup(limit) as group:
            stored = int((group.path / "memory.limit_in_bytes").read_text())
            done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                                  cwd=ROOT, preexec_fn=group.enter, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert stored == page_floor(limit) and seen["memory"] == stored and seen["source"] == "cgroup limit"
        assert (not seen["problems"]) is accepted, seen["problems"]
