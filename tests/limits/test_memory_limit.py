"""The 0.5B int4 promote completes inside a real memory limit of 0.6x the checkpoint + 1 GB (issue 28).

The checkpoint is benchmarks/scaling.py's: the published Qwen2.5-0.5B shape (24 layers, hidden 896, GQA,
vocab 151,936, tied embeddings), bf16, random weights (0.99 GB), made in the test's own folder. Random
weights make the validation metrics noise, so the thresholds are opened: the subject is memory.

The limit is a child group of the v1 cgroup memory controller (tests/memlimit.py): the test makes it with
mkdir under /sys/fs/cgroup/memory, writes the limit to its memory.limit_in_bytes (and memsw, so swap is no
way around it), the relctl child writes its own pid into the group's cgroup.procs before it execs (so the
builder and the reference worker it starts are inside too), and after the promote the group is removed
with rmdir once it is empty. The group counts page cache as a CI runner's limit does; past the limit the
kernel reclaims cache and then OOM-kills, so "completes" means exit 0 with no OOM kill in the group.
The promote takes minutes on 2 cores (the reference and the builder at 0.5B).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.memlimit import run_limited

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
GB = 1 << 30


def scaling() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scaling_benchmark", ROOT / "benchmarks" / "scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_0_5b_int4_promote_completes_inside_0_6x_the_checkpoint_plus_1_gb(tmp_path: Path) -> None:
    bench = scaling()
    ckpt = bench.checkpoint("0.5b", tmp_path / "cache")
    ckpt_bytes = bench.weights_bytes(ckpt)
    assert ckpt_bytes > 0.9e9  # the published 0.5B shape at bf16, not a stand-in
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    # Two prompts and four new tokens (the benchmark runs 8 and 16): every stage still runs the whole 0.5B
    # model inside the limit (its memory is the weights', not the prompts'), in a third of the time.
    prompts = bench.PROMPTS[:2]
    (project / "data" / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    (project / "release.yaml").write_text(
        "model: limit-0-5b\nconvert:\n  precision: int4\nvalidation:\n  max_new_tokens: 4\n  min_top1_agreement: 0\n"
        "  max_mean_kl: 1000\n  max_perplexity_increase: 1000\n  min_greedy_agreement: 0\n")
    run_id = bench.log_run(project, ckpt, project / "data")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_LOGGING_LEVEL": "WARNING"}
    env.pop("MLFLOW_TRACKING_URI", None)
    limit = int(0.6 * ckpt_bytes + GB)
    done = run_limited([sys.executable, "-c", "from release.cli import main; main()", "--project-dir", str(project),
                        "promote", run_id, "--json"], limit, env=env, timeout_s=3000)
    assert not done.killed, f"OOM-killed inside {limit} bytes: {done.stderr[-2000:]}"
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["outcome"] == "released"
    assert done.peak_bytes <= limit
