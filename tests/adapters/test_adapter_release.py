"""Adapters as release units, end to end on vLLM (the built-in engine that serves LoRA beside a running base
on CPU; onnxruntime-genai's story is tests/adapters/test_ort_adapters.py, llama.cpp says why not:
test_engines_say_why_not). One module story:

  the example's base (head_dim 64, vLLM's CPU attention) released as tiny-llm v1, its adapter released onto
  tiny-llm@production without merging and validated as vLLM serves it against the merged fp32 reference;
  a second adapter beside it; relctl serve of the base with both; the first adapter's v2 released onto the
  same base (fixture `second`: production moves, the running server follows); then its rollback: an alias
  move plus a switch on the running base (same PID, answers switched, seconds reported). The adapter canary
  (v2 judged against v1 on one base) is engine-agnostic and runs once, on onnxruntime-genai
  (tests/adapters/test_ort_adapters.py): here it would repeat a vLLM adapter release for the same code path.

Every test reads the registry's and server's state or the fixtures' captured facts, never assumes version
numbers or an order (pytest-randomly shuffles; tests/adapters/test_adapter_ops.py shares the story).

vLLM starts once per release (validation) and once for the server: minutes on 2 shared cores (slow).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import httpx
import psutil
import pytest
from click.testing import CliRunner, Result

from release.adapters.trust import BaseIdentity
from release.backends import get_backend
from release.canary.adapter_mode import check_versions_bound
from release.cli import cli
from release.core.errors import InputError
from release.registry import PREVIOUS, PRODUCTION, Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.registry.versions import fetch_package
from release.signing.keys import project_trust
from tests.adapters.conftest import ADMIN_KEY, BASE, KEY, answers, relctl

pytestmark = pytest.mark.slow
SUPPORT = f"{BASE}-support"


def registry_of(story: dict[str, Any]) -> Registry:
    return Registry(resolve_store(story["project"]))


def admin_listing(url: str) -> list[dict[str, str]]:
    listed: list[dict[str, str]] = httpx.get(f"{url}/admin/adapters", timeout=30,
                                             headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["adapters"]
    return listed


@pytest.fixture(scope="module")
def second(story: dict[str, Any]) -> dict[str, Any]:
    """The support adapter's v2 released onto the story's base: production moves to it, v1 becomes previous."""
    project = story["project"]
    before = registry_of(story).aliases(SUPPORT)
    result = relctl(project, "promote", story["runs"]["support-v2"], "--onto", f"{BASE}@production", "--model",
                    SUPPORT, "--json", env=story["env"])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    # The running base follows the registry (its interval, 10 s): the tests after this one read it as served.
    deadline = time.monotonic() + 120
    while {a["served_name"]: a["version"] for a in admin_listing(story["server"]["url"])}.get(SUPPORT) \
            != report["version"]:
        assert time.monotonic() < deadline, f"the server did not follow {SUPPORT} v{report['version']}"
        time.sleep(1)
    return {"report": report, "before": before}


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
    _, headers = answers(url, SUPPORT)
    production = registry_of(story).aliases(SUPPORT)[PRODUCTION]
    assert headers["x-relctl-model"] == BASE and headers["x-relctl-version"] == "1"
    assert headers["x-relctl-adapter"] == SUPPORT and headers["x-relctl-adapter-version"] == production
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
    trained_by = registry_of(story).get_version(SUPPORT, production).tags[T.TRAINING_RUN]
    assert trained_by in (story["runs"]["support"], story["runs"]["support-v2"])
    assert chain["model"] == SUPPORT and chain["training_run"]["id"] == trained_by
    assert chain["adapter_of"]["model"] == BASE and chain["integrity"]["ok"] is True
    # The admin paths take the server's admin key and nothing else: not the completions key.
    assert httpx.get(f"{url}/admin/adapters").status_code == 401
    assert httpx.get(f"{url}/admin/adapters", headers={"Authorization": f"Bearer {KEY}"}).status_code == 403


def test_adapter_canary_bad_input_exit_2_before_traffic(story: dict[str, Any], second: dict[str, Any]) -> None:
    project, url = story["project"], story["server"]["url"]
    registry = registry_of(story)
    aliases = registry.aliases(SUPPORT)
    assert PREVIOUS in aliases, f"no second released version: {aliases} ({second['report'].get('version')})"
    started = time.monotonic()

    def canary(*args: str, key: str) -> Result:  # in process: the refusals need no command start-up
        return CliRunner(env={"RELCTL_API_KEY": KEY, "RELCTL_ADMIN_KEY": key}).invoke(
            cli, ["--project-dir", str(project), "canary", SUPPORT, *args, "--server", url])

    unknown = canary("--version", "987", key=ADMIN_KEY)
    assert unknown.exit_code == 2 and unknown.stderr.startswith(f"error: {SUPPORT} v987 not found"), unknown.stderr
    # A version whose signed package binds it to another base than the server runs: named, before any alias or
    # load, whatever its tags say (the server states its base; here it is said to be v2).
    production = registry.get_version(SUPPORT, aliases[PRODUCTION])
    served = BaseIdentity.from_dict(httpx.get(f"{url}/admin/adapters", timeout=30, headers={
        "Authorization": f"Bearer {ADMIN_KEY}"}).json()["base"])
    assert served is not None and (served.model, served.version) == (BASE, "1")
    with pytest.raises(InputError, match=rf"bound by its signed package to {BASE} v1 .* {BASE} v2 .*in: version"):
        check_versions_bound(registry, project_trust(project), [production], replace(served, version="2"))
    no_key = canary("--version", aliases[PREVIOUS], key="")
    assert no_key.exit_code == 2 and "needs its admin key" in no_key.stderr, no_key.stderr
    print(f"adapter canary refusals: {time.monotonic() - started:.1f}s")
    assert registry.aliases(SUPPORT) == aliases
    assert not [a for a in admin_listing(url) if ":" in a["served_name"]]


def test_adapter_rollback_switches_on_the_running_base(story: dict[str, Any], second: dict[str, Any]) -> None:
    project, env, url = story["project"], story["env"], story["server"]["url"]
    pid = story["server"]["pid"]
    aliases = registry_of(story).aliases(SUPPORT)
    assert PREVIOUS in aliases, f"nothing to roll back to: {aliases} (v2: {second['report'].get('version')})"
    now, back = aliases[PRODUCTION], aliases[PREVIOUS]
    before_texts, headers = answers(url, SUPPORT)
    assert headers["x-relctl-adapter-version"] == now
    started = time.monotonic()
    rolled = relctl(project, "rollback", SUPPORT, "--server", url, env=env)
    seconds = time.monotonic() - started
    print(f"adapter rollback (alias move + switch on the running base): {seconds:.2f}s; {rolled.stderr.strip()}")
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    after, headers = answers(url, SUPPORT)
    assert headers["x-relctl-adapter-version"] == back and after != before_texts
    # The base server process that answered before the rollback is the one that answers after it.
    assert psutil.pid_exists(pid) and psutil.Process(pid).cmdline()[-1] != "" and story["server_proc"].poll() is None
    assert story["server_proc"].pid == pid
    assert httpx.get(f"{url}/health").json()["status"] == "ok"   # the same process answered throughout


def test_engines_say_why_not() -> None:
    problem = get_backend("llama-cpp").adapter_problem("int4")
    assert problem is not None and "GGUF" in problem
    for engine in ("vllm", "onnxruntime-genai"):  # onnxruntime-genai: tests/adapters/test_ort_adapters.py
        assert get_backend(engine).adapter_problem("int4") is None
