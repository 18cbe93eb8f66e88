"""A whole memory plan: the breakdown, the verdict, and what would fit instead (largest concurrency at the
context, largest context at the concurrency, the precision that fits, the devices needed)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from release.backends.onnxruntime_genai.folder import read_model_folder
from release.backends.onnxruntime_genai.plan import (
    VALID,
    Breakdown,
    ModelSpec,
    breakdown,
    gpus_needed,
    max_concurrency,
    max_context,
    parameters,
    spec_at,
)
from release.backends.package_facts import PackageFacts, read_config_file, read_package
from release.backends.planning import GIB, Check, EnginePlan, Target
from release.backends.shape import Precision, Provider, shape_from_config
from release.core.units import size


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
    overlap_bytes: int | None = None  # the replica being replaced (None: one like this, re-sized with the load)

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
                      gpus_needed=gpus_needed(spec, target, overlap_bytes), overlap_bytes=overlap_bytes)


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
    return ModelSpec(shape_from_config(facts.config, source), cast(Precision, facts.precision), facts.weights_bytes,
                     facts.kv_dtype_bytes, "package")


def spec_from_folder(model_dir: Path, config: dict[str, Any], precision: Precision | None = None) -> ModelSpec:
    """The ModelSpec of a converted folder before it is packaged (promote's validate stage)."""
    facts = read_model_folder(model_dir, precision)
    return ModelSpec(shape_from_config(config), cast(Precision, facts.precision), facts.weights_bytes,
                     facts.kv_dtype_bytes, "package")


def engine_plan(plan: MemoryPlan, engine: str) -> EnginePlan:
    """The plan in the contract's terms (release/backends/planning.py): what every reader of a plan uses."""
    b, t = plan.breakdown, plan.target
    fit = Check("peak_gib", round(b.peak / GIB, 3), "<=", round(b.budget / GIB, 3), plan.fits,
                "" if plan.fits else plan.summary())
    return EnginePlan(
        engine=engine, fits=plan.fits, summary=plan.summary(), target=t, precision=plan.spec.precision,
        weights_bytes=b.weights, kv_bytes_per_token=b.kv_bytes_per_token, kv_cache_bytes=b.kv_cache,
        kv_capacity_tokens=None, activations_bytes=b.workspace, overhead_bytes=b.overhead,
        per_replica_bytes=b.replica, peak_bytes=b.peak, budget_bytes=b.budget, capacity_bytes=b.capacity,
        max_concurrency=plan.max_concurrency, max_context=plan.max_context,
        rollout_devices=t.gpus if t.rollout_overlap else 2 * t.gpus, checks=(fit,),
        details=plan.to_dict(), native=plan)


def with_target(plan: MemoryPlan, **changes: Any) -> MemoryPlan:
    """The same spec re-planned on a changed target (used by the plot)."""
    return make_plan(plan.spec, replace(plan.target, **changes), plan.overlap_bytes)


def _model_line(plan: MemoryPlan) -> str:
    """The architecture facts the figures rest on: parameters (active ones for MoE) and KV per token."""
    s, b = plan.spec.shape, plan.breakdown
    total, active = parameters(plan.spec), parameters(plan.spec, active=True)
    params = f"{s.family}, {total:,} parameters" + (
        f" ({active:,} active: {s.experts_per_token} of {s.experts} experts)" if active != total else "")
    kv = f"KV {b.kv_bytes_per_token:,} bytes/token" + (" (MLA latent)" if s.mla else "")
    if s.window_cache_layers:
        kv += (f"; {s.window_cache_layers} of {s.layers} layers cache at most {s.sliding_window:,} tokens "
               f"({b.kv_bytes_per_token_beyond_window:,} bytes/token beyond them)")
    elif s.sliding_layers:
        kv += (f"; attention slides over {s.sliding_window:,} tokens but the cache holds the whole context "
               "(onnxruntime-genai bounds only layer_types' sliding layers)")
    return f"{params}; {kv}"


def plan_lines(plan: MemoryPlan) -> list[str]:
    """The plan as `relctl plan` prints it."""
    lines: list[str] = []
    b, t = plan.breakdown, plan.target
    source = "the package" if plan.spec.weights_source == "package" else "config.json"
    device = t.gpu_name or f"{t.memory_gib:g} GiB"
    lines.append(f"{plan.spec.precision} weights from {source}, {t.concurrency} x {t.context} tokens "
               f"on {t.gpus} x {device}")
    lines.append(f"  {_model_line(plan)}")
    for label, value in (("weights", b.weights), ("KV cache", b.kv_cache), ("workspace", b.workspace),
                         ("overhead", b.overhead), ("rollout overlap", b.overlap), ("peak", b.peak),
                         ("budget", b.budget), ("capacity", b.capacity), ("headroom", b.headroom_bytes)):
        lines.append(f"  {label:16s}{size(value, width=9)}")
    lines.append(("✓ " if plan.fits else "✗ ") + plan.summary())
    if t.prefill_tokens is None and b.workspace > b.kv_cache:
        lines.append(f"  note: the workspace assumes all {t.concurrency} sequences prefill {t.context} tokens at once "
                   "(onnxruntime-genai's batch); --prefill-tokens plans shorter prompts")
    for alt in plan.alternatives:
        lines.append(f"  {alt.precision:5s} {'fits' if alt.fits else 'no  '}  peak {size(alt.peak_bytes, width=9)}, "
                   f"max concurrency {alt.max_concurrency} at {t.context}, max context {alt.max_context} "
                   f"at {t.concurrency}")
    return lines
