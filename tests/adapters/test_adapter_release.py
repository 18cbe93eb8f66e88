"""Adapters as release units, end to end on vLLM (the built-in engine that serves LoRA beside a running base
on CPU; onnxruntime-genai's story is tests/adapters/test_ort_adapters.py, llama.cpp says why not:
test_engines_say_why_not). One module story:

  the example's base (head_dim 64, vLLM's CPU attention) released as tiny-llm v1, its adapter released onto
  tiny-llm@production without merging and validated as vLLM serves it against the merged fp32 reference;
  a second adapter beside it; relctl serve of the base with both; the first adapter's v2 released under a
  canary against v1 on the one running base (fixture `canaried`: registered as candidate, loaded beside v1 as
  `tiny-llm-support:V`, traffic split by adapter name, judged, aliases moved); then its rollback: an alias
  move plus a switch on the running base (same PID, answers switched, seconds reported).

Every test reads the registry's and server's state or the fixtures' captured facts, never assumes version
numbers or an order (pytest-randomly shuffles; tests/adapters/test_adapter_ops.py shares the story).

vLLM starts once per release (validation) and once for the server: minutes on 2 shared cores (slow).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
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
from release.serving.router import read_records
from release.signing.keys import project_trust
from tests.adapters.conftest import ADMIN_KEY, BASE, KEY, PROMPTS, answers, relctl

pytestmark = pytest.mark.slow
SUPPORT = f"{BASE}-support"
# Small and bounded: one 50% step, 20 requests at 4/s; prompts without `expected` (quality is not judged:
# the negated v2 answers differently by design, and the validation at release compared it with its merge).
CANARY_YAML = f"""model: {BASE}
convert:
  backend: vllm
  precision: fp32
gates:
  canary:
    steps: [50]
    step_requests: 20
    step_timeout_s: 90
    traffic: {{rate: 4, output_tokens: 6, warmup: 2, dataset: canary-prompts.jsonl}}
"""


def registry_of(story: dict[str, Any]) -> Registry:
    return Registry(resolve_store(story["project"]))


def admin_listing(url: str) -> list[dict[str, str]]:
    listed: list[dict[str, str]] = httpx.get(f"{url}/admin/adapters", timeout=30,
                                             headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["adapters"]
    return listed


@pytest.fixture(scope="module")
def canaried(story: dict[str, Any]) -> dict[str, Any]:
    """The support adapter's v2 released with gates.canary against the story's running base: registered as
    candidate, judged against production on that one server, aliases and served names as the outcome says.
    Captures what a test checks right after it (other tests move aliases later)."""
    project, url = story["project"], story["server"]["url"]
    registry = registry_of(story)
    before = registry.aliases(SUPPORT)
    (project / "canary-prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    config = project / "release-canary.yaml"  # beside release.yaml: the signing key resolves the same way
    config.write_text(CANARY_YAML)
    started = time.monotonic()
    result = relctl(project, "promote", story["runs"]["support-v2"], "--onto", f"{BASE}@production", "--model",
                    SUPPORT, "-c", str(config), "--server", url, "--json", env=story["env"])
    seconds = time.monotonic() - started
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout)
    return {"result": result, "report": report, "before": before, "after": registry.aliases(SUPPORT),
            "listing": admin_listing(url), "seconds": seconds, "served": answers(url, SUPPORT)}


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


def test_adapter_v2_canary_against_v1_on_one_base(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    report, before, after = canaried["report"], canaried["before"], canaried["after"]
    version, canary = report["version"], report["canary"]
    assert canary is not None, report
    assert version not in before.values(), (version, before)   # a new version, judged against production
    old = before[PRODUCTION]
    print(f"adapter canary: {canary['status']} in {report['seconds'].get('canary')}s "
          f"(release + canary {canaried['seconds']:.0f}s): {canary['reason']}")
    assert canary["adapter"]["arms"] == {"production": SUPPORT, "candidate": f"{SUPPORT}:{version}"}
    # Both arms answered by the one base process: same server URL, its base version on every answer, the
    # adapter version of each arm named by the answer's headers, and the same PID before and after.
    assert canary["adapter"]["server"] == story["server"]["url"].rstrip("/")
    records = [r for r in read_records(Path(canary["records"])) if r.step != "warmup"]
    by_side = {side: [r for r in records if r.backend == side and r.ok] for side in ("production", "candidate")}
    assert min(len(rs) for rs in by_side.values()) >= 10, {k: len(v) for k, v in by_side.items()}
    assert {(r.model, r.version) for r in records if r.ok} == {(BASE, "1")}
    assert {r.adapter_version for r in by_side["production"]} == {old}
    assert {r.adapter_version for r in by_side["candidate"]} == {version}
    assert story["server_proc"].poll() is None and psutil.pid_exists(story["server"]["pid"])
    assert story["server_proc"].pid == story["server"]["pid"]
    # The candidate's pinned name is gone afterwards; the alias moved as the outcome says, and the served
    # adapter follows production.
    served = {a["served_name"]: a["version"] for a in canaried["listing"]}
    assert f"{SUPPORT}:{version}" not in served
    mv = registry_of(story).get_version(SUPPORT, version)
    if canary["outcome"] == "pass":
        assert canaried["result"].returncode == 0 and report["outcome"] == "released"
        assert after[PRODUCTION] == version and after[PREVIOUS] == old and "candidate" not in after
        assert mv.tags[T.RELEASE_STATE] == "released" and mv.tags["gate.canary.status"] == "pass"
    else:
        assert canaried["result"].returncode == 1 and report["outcome"] == f"canary-{canary['outcome']}"
        assert after[PRODUCTION] == old and "candidate" not in after
        assert mv.tags["gate.canary.status"] == "fail"
    assert served[SUPPORT] == after[PRODUCTION]
    assert canaried["served"][1]["x-relctl-adapter-version"] == after[PRODUCTION]


def test_adapter_canary_bad_input_exit_2_before_traffic(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    project, url = story["project"], story["server"]["url"]
    registry = registry_of(story)
    aliases = registry.aliases(SUPPORT)
    assert PREVIOUS in aliases, f"no second released version: {aliases} ({canaried['report'].get('canary')})"
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


def test_adapter_rollback_switches_on_the_running_base(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    project, env, url = story["project"], story["env"], story["server"]["url"]
    pid = story["server"]["pid"]
    aliases = registry_of(story).aliases(SUPPORT)
    assert PREVIOUS in aliases, f"nothing to roll back to: {aliases} (canary: {canaried['report'].get('canary')})"
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
