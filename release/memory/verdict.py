"""A whole memory plan: the breakdown, the verdict, and what would fit instead (largest concurrency at the
context, largest context at the concurrency, the precision that fits, the devices needed)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from release.core.units import size
from release.memory.package import PackageFacts, read_config_file, read_model_folder, read_package
from release.memory.plan import (
    VALID,
    Breakdown,
    ModelSpec,
    Target,
    breakdown,
    gpus_needed,
    max_concurrency,
    max_context,
    parameters,
    spec_at,
)
from release.memory.shape import Precision, Provider, shape_from_config


@dataclass(frozen=True)
class Alternative:
    """The same target at another precision."""

    precision: Precision
    weights_source: str
    weights_bytes: int
    peak_bytes: int
    fits: bool
    max_concurrency: int
    max_context: int


@dataclass(frozen=True)
class MemoryPlan:
    spec: ModelSpec
    target: Target
    breakdown: Breakdown
    max_concurrency: int
    max_context: int
    alternatives: list[Alternative]
    gpus_needed: int | None

    @property
    def fits(self) -> bool:
        return self.breakdown.fits

    @property
    def precision_that_fits(self) -> Precision | None:
        """The highest-fidelity precision that fits (fp32 -> fp16 -> int8 -> int4): the least quality given up."""
        return next((a.precision for a in self.alternatives if a.fits), None)

    def summary(self) -> str:
        """One line: the verdict and what would fit instead."""
        t, b = self.target, self.breakdown
        head = (f"{self.spec.precision} at {t.concurrency} x {t.context} tokens needs {size(b.peak)}, "
                f"budget {size(b.budget)} ({_devices(t)}, {t.headroom:.0%} headroom)")
        if self.fits:
            return f"fits: {head}; up to {self.max_concurrency} sequences at {t.context} tokens"
        other = self.precision_that_fits
        instead = f"{other} fits" if other else "no precision fits"
        per_precision = ", ".join(f"{a.precision} {a.max_concurrency}" for a in self.alternatives)
        gpus = f"; {self.gpus_needed} x {t.gpu_name or 'devices'} would fit" if self.gpus_needed else ""
        return (f"does not fit: {head}; largest concurrency at {t.context} tokens: {self.max_concurrency} "
                f"({per_precision}); largest context at {t.concurrency} sequences: {self.max_context}; "
                f"{instead} at {t.concurrency} x {t.context}{gpus}")

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        price = t.price_per_hour * t.gpus if t.price_per_hour is not None else None
        return {
            "fits": self.fits,
            "summary": self.summary(),
            "model": {**self.spec.shape.to_dict(), "parameters": parameters(self.spec),
                      "active_parameters": parameters(self.spec, active=True),
                      "precision": self.spec.precision, "weights_source": self.spec.weights_source,
                      "kv_dtype_bytes": self.spec.kv_dtype_bytes},
            "target": {"gpu": t.gpu_name, "memory_gib": t.memory_gib, "gpus": t.gpus, "provider": t.provider,
                       "concurrency": t.concurrency, "context": t.context, "kv_dtype": t.kv_dtype,
                       "prefill_tokens": t.prefill_tokens or t.context, "headroom": t.headroom,
                       "rollout_overlap": t.rollout_overlap, "price_per_hour": price},
            "breakdown": self.breakdown.to_dict(),
            "max_concurrency": self.max_concurrency,
            "max_context": self.max_context,
            "precision_that_fits": self.precision_that_fits,
            "gpus_needed": self.gpus_needed,
            "alternatives": [a.__dict__ for a in self.alternatives],
        }


def _devices(t: Target) -> str:
    name = t.gpu_name or f"{t.memory_gib:g} GiB"
    return f"{t.gpus} x {name}" if t.gpus > 1 else name


def make_plan(spec: ModelSpec, target: Target, overlap_bytes: int | None = None) -> MemoryPlan:
    """Everything `relctl plan` and the memory gate report for `spec` on `target`."""
    alternatives = []
    for precision in VALID[target.provider]:
        other = spec_at(spec, precision, target.provider)
        row = breakdown(other, target, overlap_bytes)
        alternatives.append(Alternative(precision, other.weights_source, other.weights_bytes, row.peak, row.fits,
                                        max_concurrency(other, target, overlap_bytes),
                                        max_context(other, target, overlap_bytes)))
    return MemoryPlan(spec=spec, target=target, breakdown=breakdown(spec, target, overlap_bytes),
                      max_concurrency=max_concurrency(spec, target, overlap_bytes),
                      max_context=max_context(spec, target, overlap_bytes), alternatives=alternatives,
                      gpus_needed=gpus_needed(spec, target, overlap_bytes))


def load_spec(path: Path, precision: Precision | None, provider: Provider) -> ModelSpec:
    """A package (weights from its initializers) or a config.json (weights from the builder's layout).

    A package planned at a precision other than its own is estimated from its config.json.
    """
    if path.is_file():
        config = read_config_file(path)
        return ModelSpec.from_config(shape_from_config(config, path.name), precision or "fp16", provider)
    facts = read_package(path)
    own = spec_from_facts(facts, f"{path.name}: config.json")
    return own if precision in (None, facts.precision) else spec_at(own, precision, provider)


def spec_from_facts(facts: PackageFacts, source: str = "config.json") -> ModelSpec:
    """The ModelSpec of a built model: its own initializer bytes, precision and KV dtype."""
    return ModelSpec(shape_from_config(facts.config, source), facts.precision, facts.weights_bytes,
                     facts.kv_dtype_bytes, "package")


def spec_from_folder(model_dir: Path, config: dict[str, Any], precision: Precision | None = None) -> ModelSpec:
    """The ModelSpec of a converted folder before it is packaged (promote's validate stage)."""
    return spec_from_facts(read_model_folder(model_dir, config, precision))


def with_target(plan: MemoryPlan, **changes: Any) -> MemoryPlan:
    """The same spec re-planned on a changed target (used by the plot)."""
    return make_plan(plan.spec, replace(plan.target, **changes))
