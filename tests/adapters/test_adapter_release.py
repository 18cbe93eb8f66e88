"""Adapters as release units, end to end on vLLM (the built-in engine that serves LoRA beside a running base
on CPU; onnxruntime-genai and llama.cpp say why not: test_engines_say_why_not). One module story:

  the example's base (head_dim 64, vLLM's CPU attention) released as tiny-llm v1, its adapter released onto
  tiny-llm@production without merging and validated as vLLM serves it against the merged fp32 reference;
  a second adapter beside it; relctl serve of the base with both; the first adapter's v2, then its rollback:
  an alias move plus a switch on the running base (same PID, answers switched, seconds reported); a base
  rollback that would strand them refused.

vLLM starts once per release (validation) and once for the server: minutes on 2 shared cores (slow).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import psutil
import pytest

from release.backends import get_backend
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.registry.versions import fetch_package
from release.signing.keys import project_trust
from tests.adapters.conftest import BASE, KEY, answers, relctl

pytestmark = pytest.mark.slow


def test_adapter_released_onto_the_served_base_without_merging(story: dict[str, Any]) -> None:
    result = story["support"]
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["outcome"] == "released" and report["model"] == f"{BASE}-support"
    assert report["base"]["model"] == BASE and report["base"]["version"] == "1"
    metrics = report["validation"]["metrics"]
    assert metrics["top1_agreement"] >= 0.99 and metrics["greedy_agreement"] >= 0.99, metrics
    registry = Registry(resolve_store(story["project"]))
    mv = registry.get_version(f"{BASE}-support", report["version"])
    base = registry.get_version(BASE, "1")
    assert mv.tags[T.KIND] == "adapter" and mv.tags[T.BASE_VERSION] == "1"
    assert mv.tags[T.BASE_SHA256] == base.tags[T.BASE_SHA256]
    assert mv.tags[T.SIGNED_BY] != "unsigned"
    # The adapter alone: no base weights in its package (fetched and verified as serve and rollback do).
    package = fetch_package(registry, f"{BASE}-support", report["version"], story["project"] / "fetched",
                            trust=project_trust(story["project"]))
    assert sorted(p.name for p in package.model_dir.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert package.data["kind"] == "adapter" and package.data["base"]["version"] == "1"
    other = story["other"]
    assert other.returncode == 0, other.stderr[-2000:]
    assert json.loads(other.stdout)["model"] == f"{BASE}-other"
    print("adapter release seconds:", report["seconds"])


def test_the_base_serves_both_adapters_by_name(story: dict[str, Any]) -> None:
    url = story["server"]["url"]
    _, base_headers = answers(url, f"{BASE}:1")
    _, headers = answers(url, f"{BASE}-support")
    assert headers["x-relctl-model"] == BASE and headers["x-relctl-version"] == "1"
    assert headers["x-relctl-adapter"] == f"{BASE}-support" and headers["x-relctl-adapter-version"] == "1"
    assert "x-relctl-adapter" not in base_headers
    _, other = answers(url, f"{BASE}-other")
    assert other["x-relctl-adapter"] == f"{BASE}-other"
    listed = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    assert {m["id"] for m in listed} >= {f"{BASE}-support", f"{BASE}-other"}
    # From the answer back to the adapter's training run, through the headers it carried.
    saved = story["project"] / "headers.txt"
    saved.write_text("".join(f"{k}: {v}\n" for k, v in headers.items()))
    traced = relctl(story["project"], "trace", str(saved), "--json")
    assert traced.returncode == 0, traced.stderr[-2000:]
    chain = json.loads(traced.stdout)
    assert chain["model"] == f"{BASE}-support" and chain["training_run"]["id"] == story["runs"]["support"]
    assert chain["adapter_of"]["model"] == BASE and chain["integrity"]["ok"] is True
    # The admin paths take the server's key and nothing else.
    assert httpx.get(f"{url}/admin/adapters").status_code == 401


def test_adapter_rollback_switches_on_the_running_base(story: dict[str, Any]) -> None:
    project, env, url = story["project"], story["env"], story["server"]["url"]
    pid = story["server"]["pid"]
    v1_texts, _ = answers(url, f"{BASE}-support")
    v2 = relctl(project, "promote", story["runs"]["support-v2"], "--onto", f"{BASE}@production",
                "--model", f"{BASE}-support", "--json")
    assert v2.returncode == 0, v2.stderr[-2000:]
    assert json.loads(v2.stdout)["version"] == "2"
    loaded = httpx.post(f"{url}/admin/adapters", json={"model": f"{BASE}-support"},
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert loaded.status_code == 200 and loaded.json()["version"] == "2", loaded.text
    v2_texts, headers = answers(url, f"{BASE}-support")
    assert headers["x-relctl-adapter-version"] == "2" and v2_texts != v1_texts
    started = time.monotonic()
    rolled = relctl(project, "rollback", f"{BASE}-support", "--server", url, env=env)
    seconds = time.monotonic() - started
    print(f"adapter rollback (alias move + switch on the running base): {seconds:.2f}s; {rolled.stderr.strip()}")
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    after, headers = answers(url, f"{BASE}-support")
    assert headers["x-relctl-adapter-version"] == "1" and after == v1_texts
    # The base server process that answered before the rollback is the one that answers after it.
    assert psutil.pid_exists(pid) and psutil.Process(pid).cmdline()[-1] != "" and story["server_proc"].poll() is None
    assert story["server_proc"].pid == pid
    assert httpx.get(f"{url}/health").json()["status"] == "ok"   # the same process answered throughout


def test_engines_say_why_not() -> None:
    for engine in ("onnxruntime-genai", "llama-cpp"):
        problem = get_backend(engine).adapter_problem("int4")
        assert problem is not None and len(problem) > 20
    assert get_backend("vllm").adapter_problem("fp32") is None
