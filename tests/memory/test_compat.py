"""Memory estimate arithmetic against hand-computed values, and the honest no-GPU measurement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import onnxruntime_genai as og
import pytest
from onnx import TensorProto, helper

from release.config import ServingConfig
from release.core.errors import InputError
from release.memory.compat import (
    GIB,
    estimate_memory,
    folder_kv_dtype_bytes,
    folder_weights_bytes,
    measure_memory,
)
from release.stages.convert import convert

LLAMA2_7B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "hidden_size": 4096}
PLAN = ServingConfig(concurrency=8, context_tokens=4096, gpu_memory_gib=80, workspace_fraction=0.10,
                     rollout_replicas=2)


def test_estimate_matches_hand_computed_values() -> None:
    est = estimate_memory(LLAMA2_7B, 13_500_000_000, PLAN, kv_dtype_bytes=2)
    # 2 (K,V) x 32 layers x 32 kv heads x 128 head dim x 2 bytes = 512 KiB per token
    assert est.kv_bytes_per_token == 524_288
    assert est.kv_cache_bytes == 524_288 * 8 * 4096 == 17_179_869_184
    assert est.workspace_bytes == 3_067_986_919  # ceil(0.10 x (13.5e9 + 17_179_869_184))
    assert est.per_replica_bytes == 33_747_856_103
    assert est.peak_bytes == 67_495_712_206  # two replicas side by side during the rollout
    assert est.capacity_bytes == 85_899_345_920
    assert est.headroom_bytes == 18_403_633_714 and est.fits
    # floor((80 GiB / (2 x 1.1) - 13.5e9) / (512 KiB x 4096)) = floor(11.9)
    assert est.max_concurrency == 11


def test_over_budget_plan_does_not_fit() -> None:
    est = estimate_memory(LLAMA2_7B, 13_500_000_000, PLAN.model_copy(update={"gpu_memory_gib": 24}), 2)
    assert not est.fits
    assert est.headroom_bytes == 24 * GIB - 67_495_712_206 < 0
    assert est.max_concurrency == 0
    assert est.to_dict()["fits"] is False


def test_max_concurrency_is_the_fitting_boundary() -> None:
    est = estimate_memory(LLAMA2_7B, 13_500_000_000, PLAN, 2)
    at = estimate_memory(LLAMA2_7B, 13_500_000_000, PLAN.model_copy(update={"concurrency": est.max_concurrency}), 2)
    over = estimate_memory(
        LLAMA2_7B, 13_500_000_000, PLAN.model_copy(update={"concurrency": est.max_concurrency + 1}), 2)
    assert at.fits and not over.fits


def test_one_replica_needs_half_the_rollout_peak() -> None:
    single = estimate_memory(LLAMA2_7B, 13_500_000_000, PLAN.model_copy(update={"rollout_replicas": 1}), 2)
    double = estimate_memory(LLAMA2_7B, 13_500_000_000, PLAN, 2)
    assert double.peak_bytes == 2 * single.peak_bytes == 2 * single.per_replica_bytes


def test_grouped_query_attention_and_explicit_head_dim() -> None:
    llama3_8b = {**LLAMA2_7B, "num_key_value_heads": 8}
    assert estimate_memory(llama3_8b, 0, PLAN, 2).kv_bytes_per_token == 131_072  # 128 KiB per token
    # Gemma-7B: head_dim 256 is not hidden_size / heads (192); the config's value wins.
    gemma = {"model_type": "gemma", "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
             "hidden_size": 3072, "head_dim": 256}
    assert estimate_memory(gemma, 0, PLAN, 2).kv_bytes_per_token == 2 * 28 * 16 * 256 * 2


@pytest.mark.parametrize(
    ("config", "weights", "kv_bytes", "message"),
    [
        ({"num_attention_heads": 4, "hidden_size": 64}, 0, 2, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": 64}, 0, 2, "num_attention_heads"),
        (LLAMA2_7B, -1, 2, "weights_bytes"),
        (LLAMA2_7B, 0, 3, "kv_dtype_bytes"),
    ],
)
def test_bad_inputs_are_refused(config: dict[str, object], weights: int, kv_bytes: int, message: str) -> None:
    with pytest.raises(InputError, match=message):
        estimate_memory(config, weights, PLAN, kv_bytes)


def write_graph(path: Path, kv_type: int | None) -> None:
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])]
    if kv_type is not None:
        inputs.append(helper.make_tensor_value_info("past_key_values.0.key", kv_type, ["b", 2, "p", 16]))
    out = helper.make_tensor_value_info("y", TensorProto.INT64, ["b", "s"])
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["y"])], "g", inputs, [out])
    onnx.save(helper.make_model(graph), str(path))


@pytest.mark.parametrize(("kv_type", "size"), [(TensorProto.FLOAT, 4), (TensorProto.FLOAT16, 2)])
def test_kv_dtype_is_read_from_the_graph(tmp_path: Path, kv_type: int, size: int) -> None:
    write_graph(tmp_path / "model.onnx", kv_type)
    assert folder_kv_dtype_bytes(tmp_path) == size


def test_graph_without_kv_inputs_is_refused(tmp_path: Path) -> None:
    write_graph(tmp_path / "model.onnx", None)
    with pytest.raises(InputError, match="no float past_key_values"):
        folder_kv_dtype_bytes(tmp_path)


@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory: pytest.TempPathFactory, tiny_base_only: Path) -> Path:
    return convert(tiny_base_only, tmp_path_factory.mktemp("memory") / "fp32", "fp32").out_dir


def test_estimate_for_the_converted_tiny_model(tiny_fp32: Path, tiny_base_only: Path) -> None:
    config = json.loads((tiny_base_only / "config.json").read_text())
    weights = folder_weights_bytes(tiny_fp32)
    assert weights == (tiny_fp32 / "model.onnx").stat().st_size + (tiny_fp32 / "model.onnx.data").stat().st_size
    kv_bytes = folder_kv_dtype_bytes(tiny_fp32)
    assert kv_bytes == 4  # the CPU fp32 build keeps its KV cache in float32
    plan = ServingConfig(concurrency=4, context_tokens=128, gpu_memory_gib=1, workspace_fraction=0.1)
    est = estimate_memory(config, weights, plan, kv_bytes)
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert est.kv_bytes_per_token == 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    assert est.kv_cache_bytes == est.kv_bytes_per_token * 4 * 128
    assert est.fits and json.loads(json.dumps(est.to_dict()))["peak_bytes"] == est.peak_bytes


def test_measure_memory_is_honest_about_the_host(tiny_fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"not a model folder any installed backend serves"):
        measure_memory(tmp_path, ServingConfig())
    result = measure_memory(tiny_fp32, ServingConfig(concurrency=2, context_tokens=64))
    if shutil.which("nvidia-smi") is None:
        assert result.peak_bytes is None and "no NVIDIA GPU" in result.reason
    elif not og.is_cuda_available():
        assert result.peak_bytes is None and "onnxruntime-genai-cuda" in result.reason
    else:
        assert result.peak_bytes is not None and result.peak_bytes > folder_weights_bytes(tiny_fp32)
    assert json.loads(json.dumps(result.to_dict()))["reason"] == result.reason
