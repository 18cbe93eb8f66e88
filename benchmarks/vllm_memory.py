"""vLLM's memory plan per replica against the measured RSS of vLLM's processes on CPU (API server, engine core,
worker: the psutil process tree), and the plan's KV capacity against the line vLLM logs at start-up.

    RELCTL_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_memory.py CHECKPOINT

CHECKPOINT: a Hugging Face checkpoint vLLM's CPU attention takes (head_dim 64 or 128). Writes
benchmarks/results/vllm_memory.json. The same comparison runs in tests/backends/test_vllm.py on the promoted
example (test_the_plans_replica_is_what_vllms_processes_hold, within 15%).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from release.backends import get_backend
from release.backends.planning import Target

RESULTS = Path(__file__).parent / "results" / "vllm_memory.json"


def main(checkpoint: Path) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="vllm-memory-"))
    package = work / "pkg"
    (package / "model").mkdir(parents=True)
    (package / "source").mkdir()
    backend = get_backend("vllm")
    backend.export(checkpoint, package / "model", "fp32", "cpu", work / "export.log")
    shutil.copy2(checkpoint / "config.json", package / "source" / "config.json")
    target = Target(memory_gib=4, concurrency=8, context=128, provider="cpu", rollout_overlap=False)
    plan = backend.plan(package, target, measure=True)
    measured = plan.details["measured"]
    row = {"planned_per_replica_bytes": plan.per_replica_bytes, "resident_bytes": measured["resident_bytes"],
           "relative_error": round((plan.per_replica_bytes - measured["resident_bytes"])
                                   / measured["resident_bytes"], 4),
           "planned_kv_tokens": measured["planned_tokens"], "logged_kv_tokens": measured["kv_cache_tokens"],
           "log_line": measured["log_line"], "weights_bytes": plan.weights_bytes,
           "overhead_bytes": plan.overhead_bytes, "kv_pool_bytes": plan.kv_cache_bytes,
           "activations_bytes": plan.activations_bytes}
    RESULTS.write_text(json.dumps(row, indent=2) + "\n")
    return row


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), indent=2))
