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

from release.backends import available_backends, choose_backend
from release.backends.llama_cpp import LlamaCppBackend, toolchain
from release.backends.llama_cpp.deploy import IMAGE
from release.backends.llama_cpp.export import k_quant_problem, pre_tokenizer_of
from release.backends.llama_cpp.gguf_facts import GGUF_FILE, kv_bytes_per_token, read_gguf
from release.backends.llama_cpp.memory import replica_plan
from release.backends.planning import Target
from release.backends.shape import parameter_count, shape_from_config
from release.config import ValidationConfig, load_config
from release.core.errors import ConfigError, InputError
from release.registry import Registry
from release.registry.store import resolve_store
from release.registry.versions import fetch_package
from release.signing.keys import Trust
from release.stages.validate import load_prompts, validate
from tests.conftest import load_train_module
from tests.deploy.test_kserve import schema_problems

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
    backend = LlamaCppBackend()
    command = backend.engine_command(builds["fp16"], "m", "127.0.0.1", 8000, slots=4)
    argv = command.argv
    assert Path(argv[0]).name == "llama-server" and argv[argv.index("--parallel") + 1] == "4"
    assert argv[argv.index("--ctx-size") + 1] == str(4 * 128) and "--kv-unified" in argv  # 4 slots x full context
    # The deployment of a release planned at 4 x 128 tokens: the plan's slots, pool and memory.
    memory = {"per_replica_bytes": 300 * 2**20, "concurrency": 4, "kv_capacity_tokens": 512}
    deployment = backend.deployment({"source/config.json": {"max_position_embeddings": 128}}, memory)
    assert deployment.own_engine and deployment.engine_image == IMAGE and deployment.validated_device == "cpu"
    assert deployment.memory_bytes is not None and deployment.memory_bytes > 300 * 2**20
    template = yaml.safe_load(Path(deployment.template).read_text())
    args = [*template["spec"]["predictor"]["containers"][0]["args"], *deployment.args]
    assert args[args.index("--model") + 1] == "/mnt/models/package/model/model.gguf"
    local = [a for a in argv[1:] if a.startswith("--") and a != "--log-verbosity"]  # relctl reads its KV line
    assert set(local) <= {a for a in args if a.startswith("--")}
    assert args[args.index("--parallel") + 1] == "4" and args[args.index("--ctx-size") + 1] == "512"
    assert "--n-gpu-layers" in backend.deployment({}, memory, device="cuda").args


# -- auto's order, the plan, the settings -----------------------------------------------------------------------

def test_auto_tries_the_built_ins_first_by_declared_preference_not_by_entry_point_name() -> None:
    from importlib.metadata import entry_points

    names = [ep.name for ep in entry_points(group="relctl.backends")]
    assert sorted(names) == names or names[0] == "llama-cpp"   # setuptools writes them by name: llama-cpp first
    assert list(available_backends())[:3] == ["onnxruntime-genai", "vllm", "llama-cpp"]
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 400}
    # int4 on cpu: onnxruntime-genai, as before the plug-in was installed; fp16 on cpu: only llama.cpp builds it.
    assert choose_backend(llama, "auto", "int4", "cpu").id == "onnxruntime-genai"
    assert choose_backend(llama, "auto", "fp16", "cpu").id == "llama-cpp"
    assert LlamaCppBackend.display_name == "llama.cpp"


EXAMPLE_SHAPE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                 "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 16, "max_position_embeddings": 128, "vocab_size": 400}


def test_the_plan_of_a_config_rounds_the_kv_pool_to_256_cells(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(EXAMPLE_SHAPE))
    backend = LlamaCppBackend()
    plan = backend.plan(path, Target(memory_gib=1, concurrency=3, context=100, provider="cpu"), precision="q8_0")
    per_token = 2 * 2 * 16 * 2 * 2   # layers x kv_heads x (key + value length) x f16
    assert plan.kv_bytes_per_token == per_token
    assert plan.kv_capacity_tokens == 512 and plan.kv_cache_bytes == 512 * per_token   # 300 tokens -> 512 cells
    assert plan.weights_bytes == int(parameter_count(shape_from_config(EXAMPLE_SHAPE)) * 34 / 32)
    assert plan.per_replica_bytes == plan.weights_bytes + plan.kv_cache_bytes + plan.activations_bytes \
        + plan.overhead_bytes and plan.peak_bytes == 2 * plan.per_replica_bytes   # the reload shares the device
    assert plan.fits and plan.details["weights_source"] == "config.json"
    one = backend.plan(path, Target(memory_gib=1, concurrency=1, context=1, provider="cpu", kv_dtype="fp32"))
    assert one.kv_capacity_tokens == 256 and one.kv_cache_bytes == 256 * 2 * per_token   # one cell step, f32
    tight = backend.plan(path, Target(memory_gib=0.02, concurrency=4, context=128, provider="cpu"))
    assert not tight.fits and not tight.checks[0].passed and "does not fit on llama.cpp" in tight.summary
    for bad in (Target(memory_gib=1, concurrency=1, context=100, provider="cuda"),
                Target(memory_gib=1, concurrency=1, context=100, provider="cpu", kv_dtype="fp8"),
                Target(memory_gib=1, concurrency=1, context=129, provider="cpu")):
        with pytest.raises(InputError):
            backend.plan(path, bad)
    with pytest.raises(InputError):
        backend.plan(path, Target(memory_gib=1, concurrency=1, context=100, provider="cpu"), settings={"x": 1})


def test_relctl_plan_engine_llama_cpp_prints_its_plan(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(EXAMPLE_SHAPE))
    done = relctl(tmp_path, "plan", str(path), "--engine", "llama-cpp", "--memory-gib", "1", "--concurrency", "3",
                  "--context", "100", "--precision", "q8_0", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["engine"] == "llama-cpp" and data["kv_capacity_tokens"] == 512 and data["cache_type"] == "f16"


def test_the_plan_of_a_built_gguf_matches_what_llama_server_allocated(builds: dict[str, Path], tiny_base_only: Path,
                                                                     tmp_path: Path) -> None:
    """The memory gate's view of a package: weights from the GGUF, and the KV pool llama-server logged (the
    validation server's: 1 slot x 128 positions -> 256 cells) against the same arithmetic."""
    (tmp_path / "model").symlink_to(builds["q8_0"], target_is_directory=True)
    (tmp_path / "source").mkdir()
    shutil.copy(tiny_base_only / "config.json", tmp_path / "source" / "config.json")
    plan = LlamaCppBackend().plan(tmp_path, Target(memory_gib=2, concurrency=4, context=128, provider="cpu"),
                                  measure=True)
    assert plan.details["weights_source"] == "package"
    assert plan.weights_bytes == read_gguf(builds["q8_0"] / GGUF_FILE).weights_bytes
    assert plan.kv_capacity_tokens == 512 and plan.fits
    names = {c.name: c for c in plan.checks}
    assert names["kv_cells_relative_error"].value == 0 and names["kv_pool_error_mib"].passed, plan.details["measured"]
    assert plan.details["cold_start"]["metrics"]["load_s"] > 0


def test_convert_llama_cpp_home_is_checked_and_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(toolchain.HOME_ENV, "unset-below")   # restored after the test, whatever configure sets
    monkeypatch.delenv(toolchain.HOME_ENV)
    monkeypatch.setattr(toolchain, "_from_config", None)
    built = toolchain.home()
    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump({"convert": {"backend": "llama-cpp", "precision": "q8_0",
                                                "llama-cpp": {"home": str(tmp_path / "nowhere")}}}))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "convert.llama-cpp.home" in refused.value.message and "make llama-cpp-env" in (refused.value.hint or "")
    assert toolchain.HOME_ENV not in os.environ
    path.write_text(yaml.safe_dump({"convert": {"backend": "llama-cpp", "precision": "q8_0",
                                                "llama-cpp": {"home": str(built), "threads": 2}}}))
    load_config(path)
    assert os.environ[toolchain.HOME_ENV] == str(built.absolute()) and toolchain.missing() is None
    path.write_text(yaml.safe_dump({"convert": {"llama-cpp": {"homes": "x"}}}))
    with pytest.raises(ConfigError):
        load_config(path)


# -- end to end: promote (validation, gates), register, serve, trace, rollback ----------------------------------

@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("llama-cpp-project")
    config = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    config["convert"] = {"backend": "llama-cpp", "precision": "q8_0"}
    config["gates"].pop("canary")   # the first release has no production to compare with
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
    assert statuses == {"eval": "pass", "safety": "pass", "load": "pass", "memory": "pass"}, report["gates"]
    memory = next(g for g in report["gates"] if g["gate"] == "memory")
    # llama.cpp's own plan: 4 x 128 tokens in 512 cells, and the pool llama-server logged agrees with it.
    assert memory["details"]["engine"] == "llama-cpp", memory
    assert memory["metrics"]["kv_capacity_tokens"] == 512 and memory["metrics"]["kv_cells_relative_error"] == 0
    registry = Registry(resolve_store(released["project"]))
    package = fetch_package(registry, MODEL, "1", tmp_path, trust=Trust(off=True))  # no trusted keys: digests only
    assert package.backend_id == "llama-cpp"
    assert "model/model.gguf" in package.data["files"]
    model_files = [name for name in package.data["files"] if name.startswith("model/")]
    assert not any(name.endswith((".onnx", ".safetensors")) for name in model_files), model_files


@pytest.mark.slow
def test_render_kserve_of_the_llama_cpp_release_runs_llama_server(released: dict[str, Any], tmp_path: Path) -> None:
    """The released version's InferenceService: llama.cpp's image running llama-server on the verified GGUF,
    with the slots, KV pool and memory its release recorded, not relctl's image running relctl serve."""
    assert released["promote"].returncode == 0, "the first release failed: see its test"
    done = relctl(released["project"], "render", "kserve", f"{MODEL}/1", "--image", "ghcr.io/example/relctl:1",
                  timeout=300)
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(done.stdout)
    assert schema_problems(manifest, tmp_path) == []   # KServe's own InferenceService schema
    predictor = manifest["spec"]["predictor"]
    engine = predictor["containers"][0]
    assert engine["image"] == IMAGE and "command" not in engine   # the image's entrypoint: llama-server
    args = engine["args"]
    assert args[args.index("--model") + 1] == "/mnt/models/package/model/model.gguf"
    assert "--kv-unified" in args and args[args.index("--cache-ram") + 1] == "0"
    assert manifest["metadata"]["annotations"]["relctl/backend"] == "llama-cpp"
    assert "nvidia.com/gpu" not in engine["resources"]["limits"]
    registry = Registry(resolve_store(released["project"]))
    recorded, _ = registry.recorded_numbers(registry.get_version(MODEL, "1"))
    # Promote's memory stage planned serving.concurrency sequences at the model's 128 positions (the default
    # context 512 is beyond it): the pool rounded to 256 cells is what llama-server is started with.
    slots, cells = recorded["memory.concurrency"], recorded["memory.kv_capacity_tokens"]
    assert recorded["memory.context_tokens"] == 128 and cells == -(-slots * 128 // 256) * 256, recorded
    assert args[args.index("--parallel") + 1] == str(int(slots))
    assert args[args.index("--ctx-size") + 1] == str(int(cells))
    per_replica = recorded["memory.per_replica_bytes"]
    limit = engine["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and int(limit[:-2]) * 2**20 >= per_replica
    pull = predictor["initContainers"][0]
    assert pull["image"] == "ghcr.io/example/relctl:1" and "pull" in pull["command"]
    gpu = relctl(released["project"], "render", "kserve", f"{MODEL}/1", "--image", "x", "--gpus", "1", timeout=300)
    assert gpu.returncode == 2 and "validated for cpu" in gpu.stderr


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
