"""Memory: the serving memory plan of the candidate, its own stage so only memory settings re-run it.

Fingerprinted on the candidate build and the memory-relevant serving settings (concurrency, context,
accelerator memory, workspace share, rollout replicas) only: changing the server's queue size re-runs
neither this nor validation. A plan that does not fit blocks the release (exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from release.backends import get_backend
from release.config import ServingConfig
from release.core.units import size
from release.memory.compat import estimate_memory
from release.stages.base import Stage, StageInputs, StageResult, location

MEMORY_SETTINGS = ("concurrency", "context_tokens", "gpu_memory_gib", "workspace_fraction", "rollout_replicas")


def memory_settings(serving: ServingConfig) -> dict[str, Any]:
    return {key: getattr(serving, key) for key in MEMORY_SETTINGS}


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
        config = json.loads(self.inputs.config_path.read_text())
        serving = ServingConfig.model_validate(self.inputs.settings)
        facts = get_backend(self.inputs.backend).memory_facts(self.inputs.runtime_dir, None)
        estimate = estimate_memory(config, facts.weights_bytes, serving, kv_dtype_bytes=facts.kv_dtype_bytes)
        data = estimate.to_dict()
        (out / "memory.json").write_text(json.dumps(data, indent=2))
        return MemoryResult(fits=bool(data["fits"]), estimate=data)

    def summary(self, result: MemoryResult) -> str:
        e = result.estimate
        verdict = "fits" if result.fits else "DOES NOT FIT"
        return (f"{verdict}: peak {size(e['peak_bytes'])} of {size(e['capacity_bytes'])} "
                f"at {e['concurrency']} x {e['context_tokens']} tokens, max concurrency {e['max_concurrency']}")
