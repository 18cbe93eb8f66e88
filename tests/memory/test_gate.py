"""gates.memory: blocks a plan that cannot fit and says what would; judges cold start against production."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from onnx import TensorProto, helper, save

from gates.base import GateContext, ProductionRef
from gates.memory import MemoryGate
from release.backends.onnxruntime_genai.plan import breakdown, max_concurrency
from release.backends.onnxruntime_genai.verdict import load_spec
from release.backends.shape import builder_weights_bytes, shape_from_config
from release.core.errors import ConfigError
from release.gating.plugins import validate_block
from release.memory.settings import MemoryConfig

FIXTURES = Path(__file__).parent / "fixtures"


def seven_b_package(root: Path) -> Path:
    """A package whose model.onnx declares Mistral-7B's fp16 weights as external data (a sparse file):
    the plan reads initializer sizes, never the bytes."""
    config = json.loads((FIXTURES / "mistral-7b.json").read_text())
    size = builder_weights_bytes(shape_from_config(config), "fp16", "cuda")
    (root / "model").mkdir(parents=True)
    (root / "source").mkdir()
    (root / "source" / "config.json").write_text(json.dumps(config))
    weights = TensorProto(name="w", data_type=TensorProto.FLOAT16, dims=[size // 2],
                          data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "model.onnx.data"), ("offset", "0"), ("length", str(size))):
        weights.external_data.add(key=key, value=value)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT16, ["b", 8, "p", 128])]
    out = helper.make_tensor_value_info("y", TensorProto.INT64, ["b", "s"])
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["y"])], "g", inputs, [out], [weights])
    save(helper.make_model(graph), str(root / "model" / "model.onnx"))
    with (root / "model" / "model.onnx.data").open("wb") as f:
        f.truncate(size)
    (root / "relctl-package.json").write_text(json.dumps({"precision": "fp16", "files": {}}))
    return root


def context(tmp_path: Path, package: Path, production: Path | None = None) -> GateContext:
    prod = ProductionRef(version="1", package_dir=production, tags={}) if production else None
    return GateContext(model_name="m", package_dir=package, work_dir=tmp_path / "work", production=prod)


def test_the_gate_blocks_an_impossible_plan_and_names_what_fits(tmp_path: Path) -> None:
    package = seven_b_package(tmp_path / "pkg")
    cfg = MemoryConfig(gpu="H100-80GB", concurrency=256, context=32768, cold_start=False)
    result = MemoryGate(cfg).run(context(tmp_path, package))
    assert result.status == "fail"
    spec = load_spec(package, None, "cuda")
    assert spec.weights_source == "package"
    assert spec.weights_bytes == (package / "model" / "model.onnx.data").stat().st_size
    target = cfg.target("cuda")
    fits = max_concurrency(spec, target)
    assert breakdown(spec, replace(target, concurrency=fits)).fits
    assert not breakdown(spec, replace(target, concurrency=fits + 1)).fits
    assert f"largest concurrency at 32768 tokens: {fits} " in result.reason
    plan = result.details["plan"]
    int4 = next(a for a in plan["alternatives"] if a["precision"] == "int4")
    assert int4["max_concurrency"] >= fits and f"int4 {int4['max_concurrency']}" in result.reason
    assert "no precision fits at 256 x 32768" in result.reason and plan["precision_that_fits"] is None
    assert result.metrics["max_concurrency"] == fits
    assert {p.name for p in result.evidence} == {"memory-plan.png", "memory-plan.json"}
    # At a load it can carry, the gate names the precision that does fit.
    smaller = MemoryGate(replace_cfg(cfg, concurrency=2)).run(context(tmp_path, package))
    assert smaller.details["plan"]["precision_that_fits"] in ("fp16", "int8", "int4")


def replace_cfg(cfg: MemoryConfig, **changes: object) -> MemoryConfig:
    return cfg.model_copy(update=changes)


def test_config_needs_one_target_and_refuses_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="exactly one of 'gpu'"):
        validate_block(MemoryGate, {})
    with pytest.raises(ConfigError, match=r"unknown key 'gates\.memory\.concurency'") as err:
        validate_block(MemoryGate, {"gpu": "L4", "concurency": 4})
    assert err.value.hint == "did you mean 'concurrency'?"


def test_cold_start_is_measured_against_production_in_the_same_run(tmp_path: Path, built: dict[str, Path]) -> None:
    cfg = MemoryConfig(memory_gib=4, concurrency=2, context=128, cold_start_repeats=1)
    result = MemoryGate(cfg).run(context(tmp_path, built["int4"], production=built["fp32"]))
    cold = result.details["cold_start"]
    assert cold["candidate"]["load_s"] > 0 and cold["production"]["ttft_s"] > 0
    ratio = cold["metrics"]["cold_start_ratio"]
    assert ratio == pytest.approx(cold["candidate"]["total_s"] / cold["production"]["total_s"])
    check = next(c for c in result.thresholds if c.metric == "cold_start_ratio")
    assert check.passed == (ratio <= cold["allowed_ratio"])
    assert result.status == ("pass" if check.passed else "fail")
    strict = MemoryGate(replace_cfg(cfg, max_cold_start_ratio=1e-6, cold_start_slack_s=0))
    blocked = strict.run(context(tmp_path, built["int4"], production=built["fp32"]))
    assert blocked.status == "fail" and "cold start" in blocked.reason


def test_identical_packages_get_one_capacity_with_or_without_production(tmp_path: Path) -> None:
    # Issue 38: a first release planned the replica being replaced as one like the candidate, re-sized with
    # each concurrency tried (per rollout); a later release of the same package held production's at the
    # planned load (per replica beside it): 1,218 and 2,433 sequences for one plan.
    package = seven_b_package(tmp_path / "pkg")
    production = seven_b_package(tmp_path / "prod")
    cfg = MemoryConfig(gpu="H100-80GB", concurrency=4, context=4096, cold_start=False)
    first = MemoryGate(cfg).run(context(tmp_path / "first", package))
    later = MemoryGate(cfg).run(context(tmp_path / "later", package, production))
    assert first.status == later.status == "pass"
    assert first.metrics["max_concurrency"] == later.metrics["max_concurrency"]
    assert first.reason == later.reason
    capacity = int(first.metrics["max_concurrency"])
    assert f"up to {capacity} sequences at 4096 tokens" in later.reason
    assert later.details["overlap_from"] == "production, planned as the candidate's own (the same replica)"
