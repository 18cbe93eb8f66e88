"""Memory: the serving memory plan of the candidate by its own engine (`Backend.plan`), its own stage so only
memory settings re-run it.

Fingerprinted on the candidate build and the memory-relevant serving settings (concurrency, context,
accelerator memory, rollout replicas) only: changing the server's queue size re-runs neither this nor
validation. A plan that does not fit blocks the release (exit 1). Its figures are recorded as `memory.*`
on the version: `per_replica_bytes` is what the engines table, the card and `relctl render kserve` use.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from release.backends import get_backend
from release.backends.planning import EnginePlan, Target
from release.backends.shape import shape_from_config
from release.config import ServingConfig
from release.core.units import size
from release.stages.base import Stage, StageInputs, StageResult, location

MEMORY_SETTINGS = ("concurrency", "context_tokens", "gpu_memory_gib", "rollout_replicas")


def memory_settings(serving: ServingConfig) -> dict[str, Any]:
    return {key: getattr(serving, key) for key in MEMORY_SETTINGS}


def estimate(plan: EnginePlan, serving: ServingConfig) -> dict[str, Any]:
    """The plan's figures as the release report and the version's `memory.*` numbers name them."""
    return {"engine": plan.engine, "fits": plan.fits, "summary": plan.summary, "concurrency": serving.concurrency,
            "context_tokens": plan.target.context, "rollout_replicas": serving.rollout_replicas,
            "peak_bytes": plan.peak_bytes, "capacity_bytes": plan.capacity_bytes,
            "headroom_bytes": plan.headroom_bytes, "per_replica_bytes": plan.per_replica_bytes,
            "weights_bytes": plan.weights_bytes, "kv_cache_bytes": plan.kv_cache_bytes,
            "kv_bytes_per_token": plan.kv_bytes_per_token, "workspace_bytes": plan.activations_bytes,
            "overhead_bytes": plan.overhead_bytes, "max_concurrency": plan.max_concurrency,
            **({"kv_capacity_tokens": plan.kv_capacity_tokens} if plan.kv_capacity_tokens is not None else {})}


class MemoryInputs(StageInputs):
    candidate: str = Field(description="fingerprint of the candidate build")
    settings: dict[str, Any]
    backend: str = Field(description="id of the backend that built the candidate (it reads its own files)")
    runtime_dir: Path = location()
    config_path: Path = location()


class MemoryResult(StageResult):
    fits: bool
    estimate: dict[str, Any]


class MemoryStage(Stage[MemoryInputs, MemoryResult]):
    name = "memory"
    result_type = MemoryResult

    def run(self, out: Path) -> MemoryResult:
        serving = ServingConfig.model_validate(self.inputs.settings)
        backend = get_backend(self.inputs.backend)
        facts = backend.memory_facts(self.inputs.runtime_dir, None)
        # A serving.context_tokens the file sets beyond the model's maximum was refused by `relctl check` and
        # promote's first step (release/pipeline/contexts.py); one beyond it here is the default (512), a
        # planning figure nobody chose: plan what the model can hold instead of refusing every short model.
        longest = shape_from_config(json.loads(self.inputs.config_path.read_text())).max_positions
        target = Target(memory_gib=serving.gpu_memory_gib, concurrency=serving.concurrency,
                        context=min(serving.context_tokens, longest),
                        provider="cuda" if facts.provider == "cuda" else "cpu",
                        headroom=0.0, rollout_overlap=serving.rollout_replicas > 1 and backend.rollout_shares_devices)
        with tempfile.TemporaryDirectory(prefix="relctl-memory-") as tmp:
            # The build seen as a package (model/ beside source/config.json), which is what a plan reads.
            view = Path(tmp)
            (view / "model").symlink_to(self.inputs.runtime_dir.resolve(), target_is_directory=True)
            (view / "source").mkdir()
            shutil.copy2(self.inputs.config_path, view / "source" / "config.json")
            plan = backend.plan(view, target)
        data = estimate(plan, serving)
        (out / "memory.json").write_text(json.dumps(data, indent=2))
        return MemoryResult(fits=plan.fits, estimate=data)

    def summary(self, result: MemoryResult) -> str:
        e = result.estimate
        verdict = "fits" if result.fits else "DOES NOT FIT"
        return (f"{verdict}: peak {size(e['peak_bytes'])} of {size(e['capacity_bytes'])} "
                f"at {e['concurrency']} x {e['context_tokens']} tokens, max concurrency {e['max_concurrency']}")
