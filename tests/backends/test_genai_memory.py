"""The onnxruntime-genai backend's memory facts and plan, read from a real converted folder: its KV dtype from
the graph's past_key_values inputs, its weights from the initializers, and the plan's KV arithmetic; promote's
memory stage records that plan (one plan per engine: no second estimate)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from release.backends import get_backend
from release.backends.onnxruntime_genai.folder import read_model_folder
from release.backends.planning import Target
from release.config import ServingConfig
from release.core.errors import InputError
from release.stages.convert import convert
from release.stages.memory import MemoryInputs, MemoryStage


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
    assert read_model_folder(tmp_path).kv_dtype_bytes == size


def test_graph_without_kv_inputs_is_refused(tmp_path: Path) -> None:
    write_graph(tmp_path / "model.onnx", None)
    with pytest.raises(InputError, match="no float past_key_values"):
        read_model_folder(tmp_path)


@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory: pytest.TempPathFactory, tiny_base_only: Path) -> Path:
    return convert(tiny_base_only, tmp_path_factory.mktemp("memory") / "fp32", "fp32").out_dir


def test_the_plan_of_the_converted_tiny_model(tiny_fp32: Path, tiny_base_only: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_base_only / "config.json").read_text())
    facts = read_model_folder(tiny_fp32)
    assert facts.weights_bytes <= sum(p.stat().st_size for p in tiny_fp32.glob("model.onnx*"))
    assert facts.kv_dtype_bytes == 4  # the CPU fp32 build keeps its KV cache in float32
    package = tmp_path / "pkg"
    (package / "source").mkdir(parents=True)
    shutil.copytree(tiny_fp32, package / "model")
    shutil.copy2(tiny_base_only / "config.json", package / "source" / "config.json")
    plan = get_backend("onnxruntime-genai").plan(package, Target(memory_gib=1, concurrency=4, context=128,
                                                                 provider="cpu", rollout_overlap=False))
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert plan.kv_bytes_per_token == 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    assert plan.kv_cache_bytes == plan.kv_bytes_per_token * 4 * 128
    assert plan.per_replica_bytes == (plan.weights_bytes + plan.kv_cache_bytes + plan.activations_bytes
                                      + plan.overhead_bytes) == plan.peak_bytes
    assert plan.fits and json.loads(json.dumps(plan.to_dict()))["peak_bytes"] == plan.peak_bytes


def test_the_memory_stage_records_the_engines_plan(tiny_fp32: Path, tiny_base_only: Path, tmp_path: Path) -> None:
    serving = ServingConfig(concurrency=4, context_tokens=128, gpu_memory_gib=1, rollout_replicas=1)
    stage = MemoryStage(MemoryInputs(candidate="x", settings={"concurrency": 4, "context_tokens": 128,
                                                              "gpu_memory_gib": 1, "rollout_replicas": 1},
                                     backend="onnxruntime-genai", runtime_dir=tiny_fp32,
                                     config_path=tiny_base_only / "config.json"))
    result = stage.run(tmp_path)
    package = tmp_path / "pkg"
    (package / "source").mkdir(parents=True)
    (package / "model").symlink_to(tiny_fp32)
    shutil.copy2(tiny_base_only / "config.json", package / "source" / "config.json")
    plan = get_backend("onnxruntime-genai").plan(package, Target(memory_gib=1, concurrency=4, context=128,
                                                                 provider="cpu", headroom=0.0, rollout_overlap=False))
    assert result.estimate["engine"] == "onnxruntime-genai"
    assert result.estimate["per_replica_bytes"] == plan.per_replica_bytes
    assert result.estimate["concurrency"] == serving.concurrency and result.fits
    assert json.loads((tmp_path / "memory.json").read_text())["peak_bytes"] == plan.peak_bytes


def test_the_memory_stage_plans_a_vllm_build_with_the_vllm_plan(tmp_path: Path) -> None:
    """Promote's memory stage on a vLLM build: vLLM's own plan (its processes and the KV pool it takes on CPU),
    the same per-replica figure the memory gate plans, and a serving context beyond the model's positions
    planned at the model's maximum, saying so (never a figure for a context the model cannot reach)."""
    from release.backends.vllm.plan import VLLM_CPU_PROCESS_BYTES

    build = tmp_path / "build"
    build.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 256,
              "vocab_size": 320, "max_position_embeddings": 128, "dtype": "float32",
              "relctl_execution_provider": "cpu"}
    (build / "config.json").write_text(json.dumps(config))
    with (build / "model.safetensors").open("wb") as f:
        f.truncate(4 * 10**6)
    (build / "tokenizer.json").write_text("{}")
    stage = MemoryStage(MemoryInputs(candidate="x", settings={"concurrency": 4, "context_tokens": 512,
                                                              "gpu_memory_gib": 24, "rollout_replicas": 2},
                                     backend="vllm", runtime_dir=build, config_path=build / "config.json"))
    result = stage.run(tmp_path)
    e = result.estimate
    assert result.fits and e["engine"] == "vllm" and e["context_tokens"] == 128 and "planned at 128" in e["note"]
    assert e["overhead_bytes"] == VLLM_CPU_PROCESS_BYTES and e["kv_capacity_tokens"] > 0
    package = tmp_path / "pkg"
    (package / "source").mkdir(parents=True)
    (package / "model").symlink_to(build)
    shutil.copy2(build / "config.json", package / "source" / "config.json")
    gate_plan = get_backend("vllm").plan(package, Target(memory_gib=4, concurrency=4, context=128, provider="cpu",
                                                          rollout_overlap=False))
    assert e["per_replica_bytes"] == gate_plan.per_replica_bytes   # one figure per replica
