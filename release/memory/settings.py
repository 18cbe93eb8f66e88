"""`gates.memory` in release.yaml: the target the memory gate plans for, the cold-start bound, and the
user's GPU catalogue additions (also read by `relctl plan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from release.backends.planning import KV_DTYPE_BYTES, Target
from release.backends.shape import Provider
from release.config import gate_settings
from release.core.errors import ConfigError
from release.memory.catalogue import GpuSpec, find_gpu, load_catalogue


class MemoryConfig(BaseModel):
    """The memory gate's block. Give `gpu` (a catalogue name) or `memory_gib`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str | None = Field(default=None, description="GPU name from the catalogue (relctl plan --help lists them)")
    memory_gib: float | None = Field(default=None, gt=0, description="device memory, instead of a GPU name")
    gpus: int = Field(default=1, ge=1, description="devices per replica")
    concurrency: int = Field(default=8, ge=1, description="concurrent sequences per replica")
    context: int = Field(default=512, ge=1, description="context tokens per sequence (each KV cache is planned for)")
    kv_dtype: str | None = Field(default=None, description="KV cache dtype; default: the package's own")
    prefill_tokens: int | None = Field(default=None, ge=1, description="prompt tokens per sequence; default: context")
    provider: Provider | None = Field(default=None, description="default: cuda for a GPU, else the package's own")
    headroom: float = Field(default=0.10, ge=0, lt=1, description="share of memory the plan keeps free")
    rollout_overlap: bool | None = Field(default=None, description="old and new replicas share the devices in a "
                                         "rollout; default: the engine's (relctl serve reloads in place: yes; an "
                                         "engine that takes its device share up front: no, a surge)")
    engine: dict[str, dict[str, Any]] = Field(default_factory=dict, description="each engine's own plan options, "
                                              "by backend id (relctl backends; relctl plan --help)")
    catalogue: dict[str, GpuSpec] = Field(default_factory=dict, description="GPUs to add or override")
    cold_start: bool = Field(default=True, description="measure load time and first-token time")
    max_cold_start_ratio: float = Field(default=1.5, gt=0, description="candidate / production cold start")
    cold_start_slack_s: float = Field(default=0.25, ge=0, description="absolute slack added to the bound")
    cold_start_repeats: int = Field(default=3, ge=1, le=20)

    @model_validator(mode="after")
    def _one_target(self) -> MemoryConfig:
        if (self.gpu is None) == (self.memory_gib is None):
            raise ValueError("give exactly one of 'gpu' (a catalogue name) or 'memory_gib'")
        if self.kv_dtype is not None and self.kv_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"kv_dtype '{self.kv_dtype}' is not one of {', '.join(KV_DTYPE_BYTES)}")
        for backend_id, options in self.engine.items():
            check_plan_options(backend_id, options)
        return self

    def target(self, package_provider: str, shares_devices: bool = True) -> Target:
        """The Target this block describes (GPU names resolved against the catalogue with its additions)."""
        name, memory, price = None, self.memory_gib, None
        if self.gpu is not None:
            gpu = find_gpu(self.gpu, load_catalogue(self.catalogue))
            name, memory, price = gpu.name, gpu.memory_gib, gpu.price_per_hour
        provider = cast(Provider, self.provider or ("cuda" if self.gpu is not None else package_provider))
        assert memory is not None  # one of gpu / memory_gib, checked above
        return Target(memory_gib=memory, concurrency=self.concurrency, context=self.context, gpus=self.gpus,
                      provider=provider, kv_dtype=self.kv_dtype, prefill_tokens=self.prefill_tokens,
                      headroom=self.headroom, gpu_name=name,
                      rollout_overlap=self.rollout_overlap if self.rollout_overlap is not None else shares_devices,
                      price_per_hour=price, context_setting="gates.memory.context")


def check_plan_options(backend_id: str, options: dict[str, Any]) -> None:
    """ValueError unless `backend_id` is an installed backend and `options` are valid options of its plan."""
    from release.backends import available_backends  # noqa: PLC0415 - entry points, only when validated

    backend = available_backends().get(backend_id)
    if backend is None:
        raise ValueError(f"engine: '{backend_id}' is not an installed backend ({', '.join(available_backends())})")
    if backend.plan_settings is None:
        if options:
            raise ValueError(f"engine.{backend_id}: the {backend_id} plan takes no engine options")
        return
    try:
        backend.plan_settings.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ValueError(f"engine.{backend_id}.{where}: {error['msg']}") from exc


def project_catalogue(config_file: Path) -> dict[str, GpuSpec]:
    """`gates.memory.catalogue` of a release.yaml (empty when the file or the block is absent)."""
    if not config_file.is_file():
        return {}
    block = gate_settings(config_file, "memory").get("catalogue") or {}
    try:
        return {str(name): GpuSpec.model_validate(spec) for name, spec in block.items()}
    except (ValidationError, AttributeError) as exc:
        raise ConfigError(f"{config_file.name}: gates.memory.catalogue is invalid",
                          hint="each GPU needs memory_gib (> 0) and may give price_per_hour") from exc
