"""The llama.cpp backend (GGUF): built with llama.cpp's own converter and llama-quantize, validated against the
PyTorch reference with llama-server's own log-probabilities, and the example released through it end to end.

The tools come from `make llama-cpp-env` (release/backends/llama_cpp/build.py; `make test` depends on it):
llama-server and llama-quantize built from llama-cpp-python 0.3.36's vendored llama.cpp, cached per machine.
The example's tokenizer is trained for the run, so llama.cpp's converter does not know its pre-tokenizer hash:
relctl reads it from tokenizer.json (GPT-2's byte-level regex) and validation's tokenizer parity proves that
llama-server encodes the prompts and edge strings exactly as the training tokenizer (BOS included).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from release.backends import available_backends
from release.backends.llama_cpp import LlamaCppBackend, toolchain
from release.backends.llama_cpp.deploy import IMAGE, kserve_container
from release.backends.llama_cpp.export import k_quant_problem, pre_tokenizer_of
from release.backends.llama_cpp.gguf_facts import GGUF_FILE, kv_bytes_per_token, read_gguf
from release.backends.llama_cpp.memory import replica_plan
from release.config import ValidationConfig
from release.core.errors import InputError
from release.pipeline.versions import fetch_package
from release.registry import Registry
from release.registry.store import resolve_store
from release.signing.keys import Trust
from release.stages.validate import load_prompts, validate
from tests.conftest import load_train_module

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"
MODEL = "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))
# The example's validation thresholds (examples/tiny-llm/release.yaml).
THRESHOLDS = ValidationConfig.model_validate(
    {k: v for k, v in yaml.safe_load((EXAMPLE / "release.yaml").read_text())["validation"].items()})


def relctl(project: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELCTL, "--project-dir", str(project), *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)


def test_the_backend_is_an_installed_plug_in() -> None:
    assert isinstance(available_backends().get("llama-cpp"), LlamaCppBackend)
    assert toolchain.missing() is None, f"{toolchain.missing()}: run make llama-cpp-env"


def test_kv_bytes_per_token_is_layers_kv_heads_head_dim_two_and_the_cache_types_bytes() -> None:
    # The example: 2 layers, 2 KV heads of 16 -> 2 x 2 x 16 x 2 (K and V) x 2 bytes (f16 cache).
    assert kv_bytes_per_token(2, 2, 16, 16) == 256
    assert kv_bytes_per_token(32, 8, 128, 128) == 131_072            # Llama-3-8B: 128 KiB per token
    assert kv_bytes_per_token(32, 8, 128, 128, "f32") == 262_144
    assert kv_bytes_per_token(2, 2, 16, 16, "q8_0") == 136             # 34 bytes per 32 elements


def test_a_k_quant_needs_rows_that_are_multiples_of_256() -> None:
    example = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    problem = k_quant_problem(example, "q4_K_M")
    assert problem is not None and "multiples of 256" in problem and "hidden_size" in problem and "64" in problem
    assert k_quant_problem(example, "q8_0") is None and k_quant_problem(example, "fp16") is None
    assert k_quant_problem({"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512}, "q4_K_M") is None
    assert "o_proj" in (k_quant_problem({"hidden_size": 256, "num_attention_heads": 4, "head_dim": 48,
                                         "intermediate_size": 512}, "q4_K_M") or "")


def test_only_an_exact_gpt2_byte_level_pre_tokenizer_is_named_by_relctl(tiny_base_only: Path, tmp_path: Path) -> None:
    assert pre_tokenizer_of(tiny_base_only / "tokenizer.json") == "gpt-2"
    data = json.loads((tiny_base_only / "tokenizer.json").read_text())
    for change in ({"add_prefix_space": True}, {"use_regex": False}):
        other = tmp_path / "tokenizer.json"
        other.write_text(json.dumps({**data, "pre_tokenizer": {**data["pre_tokenizer"], **change}}))
        assert pre_tokenizer_of(other) == "", change  # left to the converter's own table (which refuses it)
    assert pre_tokenizer_of(tmp_path / "missing.json") == ""


def test_a_missing_build_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(toolchain.HOME_ENV, str(tmp_path / "no-build"))
    problem = LlamaCppBackend().target_problem("q8_0", "cpu")
    assert problem is not None and "no-build" in problem and "make llama-cpp-env" in problem
    assert "not built" in LlamaCppBackend().version()
    assert LlamaCppBackend().target_problem("int4", "cpu") is not None  # not a llama.cpp precision
    assert LlamaCppBackend().target_problem("fp16", "cuda") is not None  # built for CPU only


def test_the_example_family_is_taken_and_others_refused() -> None:
    backend = LlamaCppBackend()
    assert backend.supports({"architectures": ["LlamaForCausalLM"]}).supported
    refused = backend.supports({"architectures": ["GPT2LMHeadModel"]})
    assert not refused.supported and "GPT2LMHeadModel" in refused.reason
    assert not backend.supports({}).supported


@pytest.fixture(scope="module")
def builds(tiny_base_only: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    backend, root, out = LlamaCppBackend(), tmp_path_factory.mktemp("gguf"), {}
    for precision in ("fp16", "q8_0"):
        folder = root / precision
        folder.mkdir()
        result = backend.export(tiny_base_only, folder, precision, "cpu", root / f"{precision}.log")
        assert any("pre-tokenizer 'gpt-2'" in note for note in result.notes), result.notes
        out[precision] = folder
    return out


def test_each_precision_is_stored_as_named(builds: dict[str, Path], tiny_base_only: Path) -> None:
    expected = {"fp16": "F16", "q8_0": "Q8_0"}
    for precision, folder in builds.items():
        assert sorted(p.name for p in folder.iterdir()) == [GGUF_FILE]
        facts = read_gguf(folder / GGUF_FILE)
        assert set(facts.matrix_types().values()) == {expected[precision]}, facts.matrix_types()
        assert LlamaCppBackend().precision_of(folder) == precision
        # BOS as the training tokenizer adds it; EOS, PAD and UNK are control tokens (skipped by decode).
        config = json.loads((tiny_base_only / "config.json").read_text())
        assert facts.add_bos_token and facts.bos_token_id == config["bos_token_id"]
        assert facts.eos_token_id == config["eos_token_id"] and facts.vocab_size == config["vocab_size"]
    assert read_gguf(builds["q8_0"] / GGUF_FILE).weights_bytes < read_gguf(builds["fp16"] / GGUF_FILE).weights_bytes


def test_fp16_and_q8_0_validate_against_the_pytorch_reference(builds: dict[str, Path], tiny_base_only: Path,
                                                             tiny_data: Path) -> None:
    prompts = load_prompts(tiny_data / "validation" / "prompts.jsonl")
    backend = LlamaCppBackend()
    kl = {}
    for precision, folder in builds.items():
        result = validate(tiny_base_only, folder, prompts, tiny_base_only / "tokenizer.json", THRESHOLDS, backend)
        metrics = result.metrics
        print(f"llama.cpp {precision} vs PyTorch fp32: top-1 {metrics['top1_agreement']:.4f}, mean KL "
              f"{metrics['mean_kl']:.3g}, greedy {metrics['greedy_agreement']:.3f}, perplexity "
              f"{metrics['perplexity_increase']:+.4f}, tokenizer parity {metrics['tokenizer_parity']}")
        assert result.passed, result.failures
        assert metrics["tokenizer_parity"] == 1.0   # llama-server's /tokenize == the training tokenizer, BOS too
        assert result.details["reference_top_k"] == 400  # the whole distribution of the 400-token vocabulary
        kl[precision] = metrics["mean_kl"]
    assert 0 < kl["fp16"] < 1e-3 and kl["fp16"] < kl["q8_0"] < THRESHOLDS.max_mean_kl


def test_llama_server_allocates_the_kv_cache_the_gguf_arithmetic_plans(builds: dict[str, Path],
                                                                       tiny_base_only: Path) -> None:
    folder = builds["q8_0"]
    reported = LlamaCppBackend().engine_memory(folder)  # the validation server's own start-up line
    config = json.loads((tiny_base_only / "config.json").read_text())
    per_token = (config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2 * 2)
    facts = read_gguf(folder / GGUF_FILE)
    assert facts.kv_bytes_per_token() == per_token
    plan = replica_plan(facts, slots=1)
    # 1 slot x the model's 128 positions, which llama.cpp rounds up to its 256-cell step.
    assert reported.kv_cache_tokens == plan.kv_tokens == 256, reported.log_line
    assert reported.max_model_len == config["max_position_embeddings"]  # each slot capped at the training context
    assert reported.kv_cache_bytes is not None
    assert abs(reported.kv_cache_bytes - plan.kv_bytes) <= 0.01 * 2**20, (reported.log_line, plan)
    print(f"llama.cpp KV: planned {plan.kv_bytes:,} B for {plan.kv_tokens} tokens; llama-server: {reported.log_line}; "
          f"RSS {reported.resident_bytes:,} B vs planned replica {plan.total_bytes:,} B")


def test_q4_k_m_of_the_64_wide_example_is_refused_before_the_converter_runs(tiny_base_only: Path,
                                                                            tmp_path: Path) -> None:
    out = tmp_path / "q4"
    out.mkdir()
    with pytest.raises(InputError) as refused:
        LlamaCppBackend().export(tiny_base_only, out, "q4_K_M", "cpu", tmp_path / "q4.log")
    assert "multiples of 256" in refused.value.message and "q8_0" in (refused.value.hint or "")
    assert list(out.iterdir()) == []


def test_server_and_kserve_start_llama_server_with_the_same_flags(builds: dict[str, Path]) -> None:
    command = LlamaCppBackend().engine_command(builds["fp16"], "m", "127.0.0.1", 8000, slots=4)
    argv = command.argv
    assert Path(argv[0]).name == "llama-server" and argv[argv.index("--parallel") + 1] == "4"
    assert argv[argv.index("--ctx-size") + 1] == str(4 * 128) and "--kv-unified" in argv  # 4 slots x full context
    container = kserve_container("tiny-llm", slots=4, context=128, memory_bytes=300 * 2**20)
    assert container["image"] == IMAGE and container["resources"]["limits"]["memory"] == "300Mi"
    args = container["args"]
    assert args[args.index("--model") + 1] == "/mnt/models/package/model/model.gguf"
    local = [a for a in argv[1:] if a.startswith("--") and a != "--log-verbosity"]  # relctl reads its KV line
    assert [a for a in args if a.startswith("--")] == local


# -- end to end: promote (validation, gates), register, serve, trace, rollback ----------------------------------

@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("llama-cpp-project")
    config = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    config["convert"] = {"backend": "llama-cpp", "precision": "q8_0"}
    config["gates"].pop("canary")   # the first release has no production to compare with
    # The memory gate plans every engine but vLLM with onnxruntime-genai's formula (gates/memory.py): not
    # llama.cpp's, so it is not run here (a contract gap, docs/llama-cpp.md).
    config["gates"].pop("memory")
    (project / "release.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(EXAMPLE / "traffic.jsonl", project / "traffic.jsonl")
    train = load_train_module()
    run_id = train.log_run(tiny_run, project, experiment=MODEL)
    promote = relctl(project, "promote", run_id, "--json")
    return {"project": project, "run": run_id, "promote": promote, "train": train, "result": tiny_run,
            "config": config}


@pytest.mark.slow
def test_promote_releases_through_llama_cpp_with_validation_and_gates(released: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    promote = released["promote"]
    assert promote.returncode == 0, promote.stderr[-3000:]
    report = json.loads(promote.stdout)
    assert report["outcome"] == "released" and report["version"] == "1"
    validation = report["validation"]
    assert validation["passed"], validation["failures"]
    metrics = validation["metrics"]
    assert metrics["tokenizer_parity"] == 1.0 and metrics["top1_agreement"] >= 0.95 and metrics["mean_kl"] < 0.05
    shown = {k: metrics[k] for k in ("top1_agreement", "mean_kl", "greedy_agreement")}
    print(f"promote q8_0 (merged LoRA) vs PyTorch: {json.dumps(shown)}")
    statuses = {g["gate"]: g["status"] for g in report["gates"]}
    assert statuses == {"eval": "pass", "safety": "pass", "load": "pass"}, report["gates"]
    registry = Registry(resolve_store(released["project"]))
    package = fetch_package(registry, MODEL, "1", tmp_path, trust=Trust())  # no trusted keys: digests only
    assert package.backend_id == "llama-cpp"
    assert "model/model.gguf" in package.data["files"]
    model_files = [name for name in package.data["files"] if name.startswith("model/")]
    assert not any(name.endswith((".onnx", ".safetensors")) for name in model_files), model_files


@pytest.fixture(scope="module")
def second(released: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """v2: the same recipe at fp16 through llama.cpp with the eval gate, replacing v1 in production."""
    assert released["promote"].returncode == 0, "the first release failed: see its test"
    config = {**released["config"], "convert": {"backend": "llama-cpp", "precision": "fp16"},
              "gates": {"eval": released["config"]["gates"]["eval"]}}
    path = tmp_path_factory.mktemp("release-v2") / "release.yaml"
    path.write_text(yaml.safe_dump(config))
    run2 = released["train"].log_run(released["result"], released["project"], experiment=MODEL)
    return {"promote": relctl(released["project"], "promote", run2, "--config", str(path), "--json")}


@pytest.mark.slow
def test_rollback_to_the_q8_0_release_serves_it_and_traces_it(released: dict[str, Any], second: dict[str, Any],
                                                               tmp_path: Path) -> None:
    project = released["project"]
    promote = second["promote"]
    assert promote.returncode == 0, promote.stderr[-3000:]
    report = json.loads(promote.stdout)
    assert report["version"] == "2" and report["validation"]["metrics"]["mean_kl"] < 1e-3
    back = relctl(project, "rollback", MODEL, "--reason", "test: back to the q8_0 llama.cpp release", "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["changes"]["production"] == ["2", "1"]

    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([RELCTL, "--project-dir", str(project), "serve", f"{MODEL}@production", "--port", "0",
                             "--ready-file", str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ready.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ready.is_file(), proc.stderr.read() if proc.stderr else ""
        url = json.loads(ready.read_text())["url"]
        answer = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "reverse b d a f ->",
                                                           "max_tokens": 8, "temperature": 0}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-relctl-version"] == "1" and answer.headers["x-relctl-model"] == MODEL
        body = answer.json()
        assert body["choices"][0]["text"].strip() == "f a d b", body  # the example's task, served by llama.cpp
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert "llama.cpp" in health["batching"]["note"]
        headers = tmp_path / "headers.txt"
        headers.write_text("".join(f"{k}: {v}\n" for k, v in answer.headers.items()))
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    traced = relctl(project, "trace", str(headers), "--json")
    assert traced.returncode == 0, traced.stderr
    assert released["run"] in traced.stdout


def test_q4_k_m_of_a_256_wide_llama_is_stored_as_k_quants(tiny_base_only: Path, tmp_path: Path) -> None:
    """The k-quant path itself: a Llama whose every matrix row is 256 wide (random weights, the example's
    tokenizer) builds as Q4_K/Q6_K only, nothing fallen back to a legacy type."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    checkpoint = tmp_path / "wide"
    checkpoint.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(tiny_base_only / name, checkpoint / name)
    example = json.loads((tiny_base_only / "config.json").read_text())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=example["vocab_size"], hidden_size=256, intermediate_size=512,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=128, bos_token_id=example["bos_token_id"],
                                 eos_token_id=example["eos_token_id"])).save_pretrained(checkpoint)
    out = tmp_path / "q4"
    out.mkdir()
    result = LlamaCppBackend().export(checkpoint, out, "q4_K_M", "cpu", tmp_path / "q4.log")
    types = read_gguf(out / GGUF_FILE).matrix_types()
    assert set(types.values()) <= {"Q4_K", "Q6_K"} and "Q4_K" in types.values(), types
    assert LlamaCppBackend().precision_of(out) == "q4_K_M"
    assert any("Q4_K" in note for note in result.notes), result.notes
