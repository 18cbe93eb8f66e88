"""The vLLM memory plan (release/memory/vllm_plan.py): paged KV blocks within gpu_memory_utilization, the
capacity vLLM logs at start-up, chunked prefill, the surge rollout, and the memory gate on a vLLM package.
The plan against the capacity a running vLLM reports is tested end to end in tests/backends/test_vllm.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gates.base import GateContext
from gates.memory import MemoryGate
from release.backends.onnxruntime_genai.plan import GIB, Target
from release.backends.onnxruntime_genai.plan import breakdown as genai_breakdown
from release.backends.onnxruntime_genai.verdict import load_spec as genai_spec
from release.backends.shape import parameter_count, shape_from_config
from release.backends.vllm import plan as vllm_plan
from release.backends.vllm.engine import kv_cache_report
from release.cli import cli
from release.memory.settings import MemoryConfig

FIXTURES = Path(__file__).parent / "fixtures"
# Llama-3-8B's published shape (meta-llama/Meta-Llama-3-8B config.json).
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
             "tie_word_embeddings": False}
H100 = Target(memory_gib=80, concurrency=16, context=8192, gpu_name="H100-80GB", provider="cuda",
              rollout_overlap=False)
# The example's vLLM model (tests/backends/test_vllm.py): 2 layers, 2 KV heads of 64, fp32.
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 64,
        "max_position_embeddings": 128}
# What vLLM 0.32.0 logged serving that model with VLLM_CPU_KVCACHE_SPACE=1 (a run on this machine).
LOGGED = ("(EngineCore pid=11179) INFO 12-04 08:25:09 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
          "Maximum concurrency for 128 tokens per request: 4096.00x\n")


def llama3(precision: vllm_plan.VllmPrecision = "fp16") -> vllm_plan.VllmSpec:
    return vllm_plan.VllmSpec.from_config(shape_from_config(LLAMA3_8B), precision)


def test_llama3_8b_at_fp16_16_by_8k_fits_one_h100_with_its_headroom() -> None:
    spec = llama3()
    plan = vllm_plan.make_plan(spec, H100)
    b = plan.breakdown
    assert parameter_count(spec.shape) == 8_030_261_248
    assert 14.9 * GIB < b.weights < 15.0 * GIB                    # 8.03B x 2 bytes (+ the rope cache)
    assert b.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2           # 128 KiB per token
    assert b.kv_needed == 16 * GIB                                # 16 x 8192 tokens x 128 KiB
    assert b.block_size == 16 and b.page_bytes == 16 * b.kv_bytes_per_token
    assert b.budget == int(80 * GIB * 0.92)                       # vLLM 0.32.0's gpu_memory_utilization
    assert b.kv_pool == b.budget - b.weights - b.activations - b.cuda_graphs - b.overhead
    assert plan.fits and b.kv_headroom == b.kv_pool - 16 * GIB and b.kv_headroom > 30 * GIB
    assert b.num_blocks == b.kv_pool // b.page_bytes and b.kv_capacity_tokens == b.num_blocks * 16
    assert plan.max_concurrency == int(b.max_concurrency) >= 16 and b.max_concurrency == b.num_blocks / 512
    # As vLLM logs it at max_model_len 8192 (a multiple of the block: capacity = blocks x 16 exactly).
    assert plan.reported_tokens == b.kv_capacity_tokens
    assert plan.log_line() == (f"GPU KV cache size: {b.kv_capacity_tokens:,} tokens, Maximum concurrency for "
                               f"8,192 tokens per request: {b.max_concurrency:.2f}x")
    summary = plan.summary()
    assert summary.startswith("fits on vLLM: 16 x 8,192 tokens need 16.00 GiB of KV")
    assert "headroom" in summary and "rollout needs 2 x H100-80GB" in summary
    # One more sequence than the pool holds does not fit, and says why.
    over = vllm_plan.breakdown(spec, replace(H100, concurrency=plan.max_concurrency + 1), plan.settings)
    assert not over.fits and "need" in over.reasons[0]


def test_chunked_prefill_is_what_makes_the_8b_load_fit() -> None:
    # onnxruntime-genai prefills every prompt whole (16 x 8192 tokens in one pass); vLLM 8192 tokens a step.
    spec = llama3()
    plan = vllm_plan.make_plan(spec, H100)
    assert plan.batched_tokens == 8192 and plan.max_num_seqs == 1024   # vLLM's H100 server defaults
    genai = genai_breakdown(genai_spec(FIXTURES / "llama-3-8b.json", "fp16", "cuda"), replace(H100))
    assert not genai.fits and genai.workspace > 20 * plan.breakdown.activations
    smaller = vllm_plan.breakdown(spec, H100, vllm_plan.VllmSettings(max_num_batched_tokens=2048))
    assert smaller.activations < plan.breakdown.activations and smaller.kv_pool > plan.breakdown.kv_pool


def test_the_capacity_matches_what_vllm_logged_on_cpu() -> None:
    # CPU: the pool is VLLM_CPU_KVCACHE_SPACE, blocks of 128; 1 GiB / (2 layers x 2 x 2 heads x 64 x 4 B).
    spec = vllm_plan.VllmSpec.from_config(shape_from_config(TINY), "fp32")
    target = Target(memory_gib=4, concurrency=4, context=128, provider="cpu", rollout_overlap=False)
    plan = vllm_plan.make_plan(spec, target, vllm_plan.VllmSettings(kv_cache_bytes=GIB))
    assert plan.breakdown.block_size == 128 and plan.breakdown.kv_bytes_per_token == 2048
    assert plan.fits and (plan.batched_tokens, plan.max_num_seqs) == (2048, 128)   # vLLM's CPU server defaults
    log = Path(__file__).parent / "vllm-start.log"
    try:
        log.write_text(LOGGED)
        tokens, concurrency, model_len, line = kv_cache_report(log) or (0, 0.0, 0, "")
    finally:
        log.unlink()
    assert (tokens, concurrency, model_len) == (524_288, 4096.0, 128)
    assert (plan.reported_tokens, round(plan.reported_concurrency, 2)) == (tokens, concurrency)
    assert plan.log_line() == line


def test_a_context_off_the_block_grid_rounds_up_to_whole_blocks() -> None:
    spec = llama3()
    def blocks(context: int) -> int:
        return vllm_plan.breakdown(spec, replace(H100, context=context), vllm_plan.VllmSettings()).blocks_per_request

    at = vllm_plan.breakdown(spec, replace(H100, context=8190), vllm_plan.VllmSettings())
    assert at.blocks_per_request == 512 and at.kv_needed == 16 * 512 * at.page_bytes
    assert (blocks(8177), blocks(8176), blocks(8192)) == (512, 511, 512)


def test_same_device_rollout_is_an_option_and_needs_a_smaller_share() -> None:
    spec = llama3()
    surge = vllm_plan.make_plan(spec, H100)
    assert surge.rollout_gpus == 2 and surge.breakdown.overlap == 0
    shared = vllm_plan.make_plan(spec, replace(H100, rollout_overlap=True))
    assert not shared.fits and shared.rollout_gpus == 1
    assert "same-device rollout" in shared.summary() and "gpu_memory_utilization" in shared.summary()
    half = vllm_plan.VllmSettings(gpu_memory_utilization=0.45)
    old = vllm_plan.breakdown(spec, H100, half).peak
    assert vllm_plan.make_plan(spec, replace(H100, rollout_overlap=True), half, overlap_bytes=old).fits


def test_vllm_bounds_every_sliding_layer_and_mla_caches_its_latent() -> None:
    mistral = vllm_plan.VllmSpec.from_config(shape_from_config(json.loads((FIXTURES / "mistral-7b.json").read_text())),
                                             "fp16")
    target = replace(H100, context=32768, concurrency=4)
    b = vllm_plan.breakdown(mistral, target, vllm_plan.VllmSettings())
    # min(4096 - 1 + 8192, 32768) tokens -> 768 blocks + 1, on every layer (onnxruntime-genai keeps 32768).
    assert b.blocks_per_request == 769
    assert b.kv_needed == 4 * 769 * b.page_bytes < 4 * 32768 * b.kv_bytes_per_token
    deepseek = shape_from_config(json.loads((FIXTURES / "deepseek-v2-lite.json").read_text()))
    mla = vllm_plan.breakdown(vllm_plan.VllmSpec.from_config(deepseek, "bf16"), replace(H100, concurrency=1),
                              vllm_plan.VllmSettings())
    assert mla.kv_bytes_per_token == deepseek.layers * (deepseek.kv_lora_rank + deepseek.qk_rope_head_dim) * 2


def plan_cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    config = tmp_path / "llama-3-8b.json"
    config.write_text(json.dumps(LLAMA3_8B))
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "plan", str(config), *args])
    return result.exit_code, result.stdout, result.stderr


def test_relctl_plan_engine_vllm_prints_the_8b_verdict(tmp_path: Path) -> None:
    code, out, _ = plan_cli(tmp_path, "--engine", "vllm", "--gpu", "H100-80GB", "--concurrency", "16", "--context",
                            "8192", "--precision", "fp16")
    assert code == 0, out
    assert "as vLLM logs it: GPU KV cache size:" in out and "✓ fits on vLLM" in out and "KV headroom" in out
    code, out, _ = plan_cli(tmp_path, "--engine", "vllm", "--gpu", "H100-80GB", "--concurrency", "16", "--context",
                            "8192", "--json")
    data = json.loads(out)
    assert code == 0 and data["engine"] == "vllm" and data["model"]["precision"] == "fp16"
    assert data["rollout"]["gpus_during_rollout"] == 2 and data["breakdown"]["kv_needed"] == 16 * GIB
    code, out, _ = plan_cli(tmp_path, "--engine", "vllm", "--gpu", "H100-80GB", "--concurrency", "200", "--context",
                            "8192", "--json")
    assert code == 1 and not json.loads(out)["fits"]


def test_release_yaml_convert_backend_picks_the_engine(tmp_path: Path) -> None:
    (tmp_path / "release.yaml").write_text("model: m\nconvert: {backend: vllm, precision: fp32}\n")
    code, out, _ = plan_cli(tmp_path, "--gpu", "H100-80GB", "--concurrency", "16", "--context", "8192", "--json")
    assert code == 0 and json.loads(out)["engine"] == "vllm"


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "vllm", "-o", "gpu_memory_utilization=1.5"], "gpu_memory_utilization: Input should be less than "
                                                               "or equal to 1 (a vllm plan option)"),
    (["-o", "gpu_memory_utilization=0.5"], "gpu_memory_utilization: the onnxruntime-genai plan takes no engine "
                                           "options"),
    (["--engine", "vllm", "-o", "gpu_memory_utilisation=0.5"], "gpu_memory_utilisation: Extra inputs are not "
                                                               "permitted"),
    (["--engine", "not-an-engine"], "backend 'not-an-engine' is not installed"),
    (["--engine", "vllm", "--precision", "int4"], "vLLM plans fp32, fp16, bf16, not int4"),
    (["--engine", "vllm", "--context", "16384"], "beyond the model's max_position_embeddings 8192"),
])
def test_bad_vllm_input_is_one_error_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    base = ["--gpu", "H100-80GB", "--concurrency", "16"]
    context = [] if "--context" in args else ["--context", "8192"]
    code, _, err = plan_cli(tmp_path, *base, *context, *args)
    assert code == 2 and message in err and err.count("error:") == 1 and "hint:" in err


def vllm_package(root: Path, config: dict[str, object], weights: int) -> Path:
    """A vLLM package folder (config.json, a sparse model.safetensors of `weights` bytes, tokenizer.json):
    the plan reads the safetensors' size, never its bytes."""
    model = root / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({**config, "dtype": "float16"}))
    (model / "tokenizer.json").write_text("{}")
    with (model / "model.safetensors").open("wb") as f:
        f.truncate(weights)
    return root


def test_the_memory_gate_plans_a_vllm_package_with_the_vllm_plan(tmp_path: Path) -> None:
    weights = llama3().weights_bytes
    package = vllm_package(tmp_path / "pkg", LLAMA3_8B, weights)
    cfg = MemoryConfig(gpu="H100-80GB", concurrency=16, context=8192)
    context = GateContext(model_name="m", package_dir=package, work_dir=tmp_path / "work", production=None)
    result = MemoryGate(cfg).run(context)
    assert result.status == "pass", result.reason
    plan = result.details["plan"]
    assert result.details["engine"] == "vllm" and plan["model"]["weights_source"] == "package"
    assert plan["breakdown"]["weights"] == weights and plan["rollout"]["gpus_during_rollout"] == 2
    assert "not measured" in plan["measured"]["note"]   # a GPU plan; vLLM here runs on CPU
    assert plan["per_replica_bytes"] == plan["breakdown"]["peak"]  # one figure per replica (a surge: no overlap)
    assert result.reason.startswith("fits on vLLM")
    blocked = MemoryGate(cfg.model_copy(update={"concurrency": 128})).run(context)
    assert blocked.status == "fail" and "does not fit on vLLM" in blocked.reason
