"""The plan's arithmetic and its answers: breakdown sums, the fitting boundaries, precision and devices."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from release.backends.onnxruntime_genai.plan import (
    GIB,
    RUNTIME_OVERHEAD_BYTES,
    Target,
    breakdown,
    max_concurrency,
    max_context,
)
from release.backends.onnxruntime_genai.verdict import load_spec, make_plan
from release.core.errors import InputError
from release.memory.catalogue import GpuSpec, find_gpu, load_catalogue

LLAMA3 = Path(__file__).parent / "fixtures" / "llama-3-8b.json"
TARGET = Target(memory_gib=80, concurrency=16, context=8192, gpu_name="H100-80GB")


def test_breakdown_adds_up_and_overlap_doubles_the_replica() -> None:
    spec = load_spec(LLAMA3, "fp16", "cuda")
    b = breakdown(spec, TARGET)
    assert b.replica == b.weights + b.kv_cache + b.workspace + b.overhead
    assert b.overlap == b.replica and b.peak == 2 * b.replica
    assert b.overhead == RUNTIME_OVERHEAD_BYTES["cuda"]
    assert b.budget == int(80 * GIB * 0.9) and b.fits == (b.peak <= b.budget)
    alone = breakdown(spec, replace(TARGET, rollout_overlap=False))
    assert alone.overlap == 0 and alone.peak == b.replica
    assert breakdown(spec, TARGET, overlap_bytes=123).peak == b.replica + 123


def test_max_concurrency_and_context_are_the_fitting_boundaries() -> None:
    spec = load_spec(LLAMA3, "fp16", "cuda")
    n = max_concurrency(spec, TARGET)
    assert n > 0
    assert breakdown(spec, replace(TARGET, concurrency=n)).fits
    assert not breakdown(spec, replace(TARGET, concurrency=n + 1)).fits
    ctx = max_context(spec, replace(TARGET, concurrency=4))
    assert breakdown(spec, replace(TARGET, concurrency=4, context=ctx)).fits
    assert ctx == spec.shape.max_positions or not breakdown(spec, replace(TARGET, concurrency=4, context=ctx + 1)).fits


def test_smaller_precisions_fit_more_and_the_plan_names_the_best_that_fits() -> None:
    plan = make_plan(load_spec(LLAMA3, "fp32", "cuda"), replace(TARGET, concurrency=4))
    by = {a.precision: a for a in plan.alternatives}
    assert by["fp32"].max_concurrency <= by["fp16"].max_concurrency <= by["int8"].max_concurrency
    assert by["int8"].max_concurrency <= by["int4"].max_concurrency
    assert plan.precision_that_fits == next(a.precision for a in plan.alternatives if a.fits)
    assert not plan.fits and plan.gpus_needed is not None
    bigger = breakdown(plan.spec, replace(plan.target, gpus=plan.gpus_needed))
    assert bigger.fits and not breakdown(plan.spec, replace(plan.target, gpus=plan.gpus_needed - 1)).fits


def test_a_smaller_kv_dtype_halves_the_cache() -> None:
    spec = load_spec(LLAMA3, "fp16", "cuda")
    assert breakdown(spec, replace(TARGET, kv_dtype="fp8")).kv_cache * 2 == breakdown(spec, TARGET).kv_cache


def test_catalogue_additions_override_and_unknown_names_get_a_suggestion() -> None:
    catalogue = load_catalogue({"h100 80gb": GpuSpec(memory_gib=79, price_per_hour=9.5), "X1": GpuSpec(memory_gib=7)})
    assert find_gpu("H100-80GB", catalogue).memory_gib == 79 and find_gpu("x1", catalogue).price_per_hour is None
    with pytest.raises(InputError, match="unknown GPU 'A100'") as err:
        find_gpu("A100", catalogue)
    assert err.value.hint is not None and "did you mean 'A100-40GB'" in err.value.hint


def test_a_converted_folder_is_planned_before_packaging(built: dict[str, Path]) -> None:
    import json

    from release.backends.onnxruntime_genai.verdict import spec_from_folder
    from release.backends.package_facts import read_package

    facts = read_package(built["int8"])
    spec = spec_from_folder(facts.model_dir, json.loads((built["int8"] / "source" / "config.json").read_text()))
    assert (spec.precision, spec.weights_bytes, spec.kv_dtype_bytes) == ("int8", facts.weights_bytes, 4)
