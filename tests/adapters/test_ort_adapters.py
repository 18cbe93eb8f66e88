"""Adapters as release units on onnxruntime-genai (docs/adapters.md), end to end on the example's tiny model:

  the base released int4 and LoRA-ready (convert.onnxruntime-genai.adapters: zero LoRA inputs beside every
  projection); the run's adapter released onto tiny-llm@production without merging, as an .onnx_adapter,
  validated as og serves it on the int4 base against the merged fp32 reference; an adapter for a module the
  base takes none on refused (exit 2, seconds, nothing registered); relctl serve of the base with the adapter
  by name; a second adapter released while the server runs, loaded by the server itself (it follows the
  registry); v2 released under a canary against v1 on the one running base (traffic
  split by adapter name); `relctl rollback ADAPTER --server` and the admin switch on that base (same PID);
  10,000 requests from concurrent clients while the admin key switches v1 <-> v2 (no request fails: a request
  holds the version it was routed to until its job ends), every way a request ends giving its hold back, a
  rejected version refused (409) and the completions key kept out of /admin; a rollback without --server
  followed by the server (its registry record says what it serves), and production versions not bound to its
  base held back (by their tags, and by a signed package that contradicts them).

One module story with real parts: MLflow on SQLite, the model builder, og.Adapters, relctl serve on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from release.adapters.trust import BaseIdentity
from release.backends.jobs import Finished, GenerationParams
from release.backends.onnxruntime_genai.adapters import ADAPTER_FILE, BLOCKS, lora_inputs
from release.core.server_settings import ServerSettings
from release.registry import PREVIOUS, PRODUCTION, Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.registry.versions import fetch_package
from release.serving.adapter_setup import registry_fetch
from release.serving.adapters import AdapterTable, engine_name
from release.serving.engine import open_engine
from release.serving.router import read_records
from release.serving.source import resolve_package
from release.signing.keys import project_trust
from tests.adapters.conftest import PROMPTS, answers
from tests.adapters.test_adapter_registry import signed_adapter
from tests.adapters.test_base_match import adapter_version
from tests.adapters.test_base_match import relctl as inline  # in process: the registry reads, no interpreter start
from tests.conftest import load_train_module

BASE = "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))
SUPPORT = f"{BASE}-support"
KEY = "ort-adapter-key"          # completions (--api-key, RELCTL_API_KEY)
ADMIN_KEY = "ort-adapter-admin"  # adapter switches (--admin-key, RELCTL_ADMIN_KEY)
ENV = {"RELCTL_API_KEY": KEY, "RELCTL_ADMIN_KEY": ADMIN_KEY}
READY = "  onnxruntime-genai:\n    adapters:\n      target_modules: [all-linear]\n"
FOLLOW_S = "1"  # the server reads the registry every second here (default 10)


def relctl(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELCTL, "--project-dir", str(project), *args], capture_output=True, text=True,
                          env={**os.environ, **ENV}, timeout=900)


def served(url: str) -> dict[str, str]:
    """What the server serves now: served name -> version."""
    listing = httpx.get(f"{url}/admin/adapters", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30).json()
    return {a["served_name"]: a["version"] for a in listing["adapters"]}


def wait_for(what: str, check: Any, deadline_s: float = 120) -> Any:
    """`check()` once it is truthy (the server reads the registry every FOLLOW_S); fails naming `what`."""
    deadline = time.monotonic() + deadline_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"the server never {what}"
        time.sleep(0.5)
    return found


def variant(result: Any, folder: Path, change: str) -> Any:
    """The run's data with its checkpoint changed: `base` (no adapter), `negated` (lora_B times -1: another
    adapter of the same base: v2, and the second adapter beside the first) or
    `lm_head` (a LoRA on lm_head too: a module the LoRA-ready base takes none on)."""
    shutil.copytree(result.data_dir, folder)
    ckpt = folder / "checkpoint"
    weights, config = ckpt / "adapter_model.safetensors", ckpt / "adapter_config.json"
    if change == "base":
        weights.unlink()
        config.unlink()
    else:
        tensors = load_file(weights)
        if change == "negated":
            tensors = {k: -v if "lora_B" in k else v for k, v in tensors.items()}
        else:
            first = next(v for k, v in tensors.items() if k.endswith("q_proj.lora_A.weight"))  # [r, hidden]
            vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
            tensors["base_model.model.lm_head.lora_A.weight"] = first.copy()
            tensors["base_model.model.lm_head.lora_B.weight"] = np.zeros((vocab, first.shape[0]), first.dtype)
            cfg = json.loads(config.read_text())
            config.write_text(json.dumps({**cfg, "target_modules": [*cfg["target_modules"], "lm_head"]}))
        save_file(tensors, weights)
    return replace(result, checkpoint_dir=ckpt, data_dir=folder)


def switch(url: str, model: str, version: str) -> httpx.Response:
    return httpx.post(f"{url}/admin/adapters", json={"model": model, "version": version}, timeout=60,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"})


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> Iterator[dict[str, Any]]:
    train = load_train_module()
    root = tmp_path_factory.mktemp("ort-adapters")
    project = root / "project"
    project.mkdir()
    # Eight of the run's prompts keep validation cheap; the path is absolute (the adapter release reads it
    # as given).
    prompts = (tiny_run.data_dir / "validation" / "prompts.jsonl").read_text().splitlines()[:8]
    (root / "prompts.jsonl").write_text("\n".join(prompts) + "\n")
    head = (f"model: {BASE}\nvalidation:\n  prompts: {root / 'prompts.jsonl'}\n  max_new_tokens: 8\n"
            f"convert:\n  backend: onnxruntime-genai\n  precision: int4\n{READY}")
    # The adapter releases take release.yaml's validation as it is (adapter defaults: 0.99); the base's own
    # int4 quantization on the 64-wide example is judged by the base's usual bar, relaxed for greedy text
    # on eight prompts (its own numbers are not what this module tests).
    (project / "release.yaml").write_text(head)
    def bar(**fields: float) -> str:
        return head.replace("max_new_tokens: 8\n", "max_new_tokens: 8\n" + "".join(
            f"  {k}: {v}\n" for k, v in fields.items()))

    (root / "base.yaml").write_text(bar(min_greedy_agreement=0.5))
    # v2 (the adapter negated: untrained, its distributions flat, so int4 noise flips its argmax where the
    # trained one's holds) is held to a bar its release.yaml sets, as a team would for such an adapter.
    (root / "v2.yaml").write_text(bar(min_top1_agreement=0.95, min_greedy_agreement=0.5))
    # v2 goes out under a canary against v1 on the running base (small and bounded: one 50% step, 20
    # requests at 4/s; prompts without `expected`: the negated v2 answers differently by design).
    (project / "canary-prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (project / "release-canary.yaml").write_text(
        bar(min_top1_agreement=0.95, min_greedy_agreement=0.5) + "gates:\n  canary:\n    steps: [50]\n"
        "    step_requests: 20\n    step_timeout_s: 90\n"
        "    traffic: {rate: 4, output_tokens: 6, warmup: 2, dataset: canary-prompts.jsonl}\n")
    runs = {
        "base": train.log_run(variant(tiny_run, root / "base", "base"), project, experiment=BASE),
        "support": train.log_run(tiny_run, project, experiment="support"),
        "support-v2": train.log_run(variant(tiny_run, root / "neg", "negated"), project, experiment="support"),
        "lm_head": train.log_run(variant(tiny_run, root / "head", "lm_head"), project, experiment="head"),
        "other": train.log_run(variant(tiny_run, root / "other", "negated"), project, experiment="other"),
    }
    out: dict[str, Any] = {"project": project, "runs": runs, "seconds": {}, "root": root, "log": root / "serve.log"}

    def release(key: str, *args: str) -> None:
        started = time.monotonic()
        out[key] = relctl(project, "promote", runs[key], *args, "--json")
        out["seconds"][key] = round(time.monotonic() - started, 1)

    release("base", "-c", str(root / "base.yaml"))
    release("support", "--onto", f"{BASE}@production")
    release("lm_head", "--onto", f"{BASE}@production")
    assert out["base"].returncode == 0, out["base"].stderr[-2000:]
    ready = root / "ready.json"
    server = subprocess.Popen([RELCTL, "serve", f"{BASE}@production", "--adapters", "--port", "0", "--project-dir",
                               str(project), "--ready-file", str(ready), "--follow-interval", FOLLOW_S],
                              env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=open(out["log"], "wb"))
    try:
        # Released while the server runs (its load overlaps it): `other` is picked up by the server itself.
        release("other", "--onto", f"{BASE}@production", "-c", str(root / "v2.yaml"))
        deadline = time.monotonic() + 300
        while not ready.is_file():
            assert server.poll() is None and time.monotonic() < deadline, out["log"].read_text()[-2000:]
            time.sleep(0.5)
        out["server"] = json.loads(ready.read_text())
        out["server_proc"] = server
        yield out
    finally:
        server.terminate()
        server.wait(60)
    print("onnxruntime-genai adapter story seconds:", out["seconds"])
    print("the LoRA-ready base's release:", *[ln for ln in out["base"].stderr.splitlines() if ln.startswith("✓")],
          sep="\n  ")


def test_base_released_lora_ready(story: dict[str, Any]) -> None:
    registry = Registry(resolve_store(story["project"]))
    base = registry.get_version(BASE, "1")
    package = fetch_package(registry, BASE, "1", story["project"] / "fetched-base",
                            trust=project_trust(story["project"]))
    inputs = lora_inputs(package.model_dir)
    # Every projection of both layers takes an A and a B; the rank is the graph's symbolic dimension.
    assert {name.split(".")[4] for name in inputs} == set(BLOCKS) and len(inputs) == 2 * 2 * len(BLOCKS)
    assert all("lora_rank" in i.shape for i in inputs.values())
    assert base.tags[T.PRECISION] == "int4"


def test_adapter_released_onto_the_int4_base_without_merging(story: dict[str, Any]) -> None:
    result = story["support"]
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["outcome"] == "released" and report["backend"] == "onnxruntime-genai"
    assert report["precision"] == "int4" and report["base"]["version"] == "1"
    metrics = report["validation"]["metrics"]
    # As og serves it on the int4 base, against the merged fp32 reference, at the adapter defaults.
    assert metrics["top1_agreement"] >= 0.99 and metrics["greedy_agreement"] >= 0.99, metrics
    assert metrics["mean_kl"] <= 0.01, metrics
    registry = Registry(resolve_store(story["project"]))
    mv = registry.get_version(f"{BASE}-support", report["version"])
    assert mv.tags[T.KIND] == "adapter" and mv.tags[T.BASE_VERSION] == "1"
    package = fetch_package(registry, f"{BASE}-support", report["version"], story["project"] / "fetched",
                            trust=project_trust(story["project"]))
    # The adapter alone: its .onnx_adapter beside the PEFT files it was made from, no graph, no base weights.
    assert sorted(p.name for p in package.model_dir.iterdir()) == \
        sorted([ADAPTER_FILE, "adapter_config.json", "adapter_model.safetensors"])
    print("onnxruntime-genai adapter release:", report["seconds"], {k: metrics[k] for k in
                                                                     ("top1_agreement", "mean_kl", "greedy_agreement")})


def test_adapter_on_a_module_the_base_takes_none_on_is_refused(story: dict[str, Any]) -> None:
    result = story["lm_head"]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "lm_head" in result.stderr and "LoRA-ready" in result.stderr
    # Refused at export, before validation (the slow stage); the seconds are evidence, not a timed assertion.
    print(f"lm_head refusal after {story['seconds']['lm_head']:.1f}s (intake, base package, export)")
    registry = Registry(resolve_store(story["project"]))
    assert f"{BASE}-head" not in registry.list_models()


def test_the_base_serves_the_adapter_by_name(story: dict[str, Any]) -> None:
    url = story["server"]["url"]
    base_texts, base_headers = answers(url, f"{BASE}:1", KEY)
    texts, headers = answers(url, f"{BASE}-support", KEY)
    assert headers["x-relctl-adapter"] == f"{BASE}-support" and headers["x-relctl-adapter-version"] == "1"
    assert "x-relctl-adapter" not in base_headers
    # The trained adapter reverses the letters; the base alone was never taught the task.
    assert texts != base_texts
    assert texts[0].split()[:4] == ["f", "a", "d", "b"], texts
    story["v1"] = texts


@pytest.fixture(scope="module")
def canaried(story: dict[str, Any]) -> dict[str, Any]:
    """v2 (the negated adapter) released with gates.canary against v1 on the story's one running base."""
    project, url = story["project"], story["server"]["url"]
    registry = Registry(resolve_store(project))
    before = registry.aliases(SUPPORT)
    v1 = story.get("v1") or answers(url, SUPPORT, KEY)[0]
    result = relctl(project, "promote", story["runs"]["support-v2"], "--onto", f"{BASE}@production", "--model",
                    SUPPORT, "-c", str(project / "release-canary.yaml"), "--server", url, "--json")
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return {"result": result, "report": json.loads(result.stdout), "before": before, "v1": v1,
            "after": registry.aliases(SUPPORT), "served": answers(url, SUPPORT, KEY)}


def test_a_second_adapter_beside_the_first(story: dict[str, Any]) -> None:
    """`other` was released (promote --onto) while the server ran: the server follows the registry and loads
    it by itself, no admin request, no restart."""
    result = story["other"]
    assert result.returncode == 0, result.stderr[-2000:]
    url = story["server"]["url"]
    wait_for(f"loaded {BASE}-other", lambda: f"{BASE}-other" in served(url))
    assert f"followed the registry: {BASE}-other v" in story["log"].read_text()
    other, headers = answers(url, f"{BASE}-other", KEY)
    support, support_headers = answers(url, SUPPORT, KEY)
    assert headers["x-relctl-adapter"] == f"{BASE}-other" and support_headers["x-relctl-adapter"] == SUPPORT
    assert headers["x-relctl-model"] == support_headers["x-relctl-model"] == BASE
    assert headers["x-relctl-version"] == support_headers["x-relctl-version"] == "1"
    if support_headers["x-relctl-adapter-version"] == "1":  # the trained one (v2, after the canary, is negated too)
        assert other != support  # another adapter (the trained update negated), served by the same base process
    assert story["server_proc"].poll() is None and story["server_proc"].pid == story["server"]["pid"]


def test_adapter_v2_canary_against_v1_on_one_base(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    report, before, after = canaried["report"], canaried["before"], canaried["after"]
    version, canary = report["version"], report["canary"]
    assert canary is not None and version not in before.values(), report
    assert canary["adapter"]["arms"] == {"production": SUPPORT, "candidate": f"{SUPPORT}:{version}"}
    assert canary["adapter"]["server"] == story["server"]["url"].rstrip("/")
    records = [r for r in read_records(Path(canary["records"])) if r.step != "warmup"]
    by_side = {side: [r for r in records if r.backend == side and r.ok] for side in ("production", "candidate")}
    assert min(len(rs) for rs in by_side.values()) >= 10, {k: len(v) for k, v in by_side.items()}
    assert {(r.model, r.version) for r in records if r.ok} == {(BASE, "1")}  # one base answered both arms
    assert {r.adapter_version for r in by_side["production"]} == {before[PRODUCTION]}
    assert {r.adapter_version for r in by_side["candidate"]} == {version}
    assert story["server_proc"].poll() is None and story["server_proc"].pid == story["server"]["pid"]
    print(f"onnxruntime-genai adapter canary: {canary['status']} in {report['seconds'].get('canary')}s: "
          f"{canary['reason']}")
    if canary["outcome"] == "pass":
        assert canaried["result"].returncode == 0 and after[PRODUCTION] == version
        assert after[PREVIOUS] == before[PRODUCTION]
    else:
        assert canaried["result"].returncode == 1 and after[PRODUCTION] == before[PRODUCTION]
    assert "candidate" not in after and canaried["served"][1]["x-relctl-adapter-version"] == after[PRODUCTION]


def test_adapter_rollback_and_switch_on_the_running_base(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    """`relctl rollback ADAPTER --server`: an alias move plus a switch on the running base (same PID); then
    the admin switch both ways. Reads the aliases as they are (the tests run shuffled)."""
    project, url, pid = story["project"], story["server"]["url"], story["server"]["pid"]
    registry = Registry(resolve_store(project))
    aliases = registry.aliases(SUPPORT)
    assert PREVIOUS in aliases, f"nothing to roll back to: {aliases} ({canaried['report'].get('canary')})"
    now, back = aliases[PRODUCTION], aliases[PREVIOUS]
    before, _ = answers(url, SUPPORT, KEY)
    started = time.monotonic()
    rolled = relctl(project, "rollback", SUPPORT, "--server", url, "--json")
    print(f"onnxruntime-genai adapter rollback: {time.monotonic() - started:.2f}s end to end, "
          f"{json.loads(rolled.stdout).get('seconds') if rolled.returncode == 0 else rolled.stderr}")
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    assert registry.aliases(SUPPORT)[PRODUCTION] == back
    after, headers = answers(url, SUPPORT, KEY)
    assert headers["x-relctl-adapter-version"] == back and after != before
    if back == "1":
        assert after == canaried["v1"]  # v1's answers again, from the same process
    # The admin switch both ways, back to production at the end.
    there = switch(url, SUPPORT, now)
    assert there.status_code == 200 and there.json()["version"] == now, there.text
    assert answers(url, SUPPORT, KEY)[0] == before
    home = switch(url, SUPPORT, back)
    assert home.status_code == 200 and answers(url, SUPPORT, KEY)[0] == after
    assert [a["engine_name"] for a in home.json()["adapters"] if a["served_name"] == SUPPORT] == \
        [f"{SUPPORT}-v{back}"]
    assert story["server_proc"].poll() is None and story["server_proc"].pid == pid
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_the_server_follows_a_rollback_and_records_itself(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    """`relctl rollback ADAPTER` without --server moves production; the running server switches by itself (same
    PID), says so in its log, and its registry record (what `relctl status` shows) names what it serves.
    Production is put back at the end (the aliases as they were), and the server follows that too."""
    project, url, pid = story["project"], story["server"]["url"], story["server"]["pid"]
    registry = Registry(resolve_store(project))
    now = registry.aliases(SUPPORT)[PRODUCTION]
    back = canaried["report"]["version"] if now != canaried["report"]["version"] else canaried["before"][PRODUCTION]
    wait_for(f"served {SUPPORT} v{now}", lambda: served(url).get(SUPPORT) == now)
    rolled = inline(project, "rollback", SUPPORT, "--to", back, "--json")
    assert rolled.exit_code == 0, rolled.output
    try:
        wait_for(f"followed the rollback to v{back}", lambda: served(url).get(SUPPORT) == back)
        moved_at = datetime.fromisoformat(json.loads(rolled.stdout)["at"])  # when the alias move was recorded
        print(f"the server served v{back} at most {(datetime.now(UTC) - moved_at).total_seconds():.2f}s after "
              f"production moved (--follow-interval {FOLLOW_S})")
        assert answers(url, SUPPORT, KEY)[1]["x-relctl-adapter-version"] == back
        assert f"followed the registry: {SUPPORT} v{now} -> v{back} (production moved)" in story["log"].read_text()
        status = wait_for("recorded what it serves", lambda: next(
            (s for s in json.loads(inline(project, "status", BASE, "--json").stdout)["servers"]
             if s["pid"] == pid and s["adapters"].get(SUPPORT) == back), None))
        assert status["url"] == url and status["stale"] is False and status["follows"] is True
        assert status["base"] == {"model": BASE, "version": "1"} and status["serves_production"], status
    finally:
        forward = inline(project, "rollback", SUPPORT, "--to", now)
        assert forward.exit_code == 0, forward.output
        wait_for(f"followed back to v{now}", lambda: served(url).get(SUPPORT) == now)
    assert story["server_proc"].poll() is None and story["server_proc"].pid == pid


def test_the_server_holds_back_production_versions_not_bound_to_its_base(story: dict[str, Any],
                                                                          tiny_run: Any) -> None:
    """A production version built for another base version is not switched to: one whose tags say so (nothing
    downloaded), and one whose tags say this base but whose signed package names another. The server keeps
    serving what it served, says why in its log and in its registry record; production is put back after."""
    project, url = story["project"], story["server"]["url"]
    other = f"{BASE}-other"
    registry = Registry(resolve_store(project))
    original = registry.aliases(other)[PRODUCTION]
    wait_for(f"served {other} v{original}", lambda: served(url).get(other) == original)

    def held() -> str:
        record = next(s for s in json.loads(inline(project, "status", BASE, "--json").stdout)["servers"]
                      if s["pid"] == story["server"]["pid"])
        return str(record["held"].get(other, ""))

    try:
        adapter_version(project, other, "2", "sha256:" + "44" * 32)  # tags: built for tiny-llm v2
        tagged = registry.aliases(other)[PRODUCTION]
        why = wait_for("held back the version built for v2", lambda: f"v{tagged}" in held() and held())
        assert f"built for {BASE} v2" in why and f"keeps serving v{original}" in why, why
        lying = signed_adapter(project, story["root"] / "lying", tiny_run.checkpoint_dir, other, "1",
                               registry.get_version(BASE, "1").tags[T.BASE_SHA256], -2.0, manifest_base="2")
        why = wait_for("held back the signed package of another base", lambda: f"v{lying}" in held() and held())
        assert f"bound by its signed package to {BASE} v2" in why and f"would serve on, {BASE} v1" in why, why
        assert served(url).get(other) == original
        log = story["log"].read_text()
        assert f"not switching {other}: production is v{tagged}" in log
        assert f"{other} v{lying} is bound by its signed package to" in log
    finally:
        back = inline(project, "rollback", other, "--to", original)
        assert back.exit_code == 0, back.output
    wait_for("cleared what it held", lambda: held() == "")
    assert served(url).get(other) == original


LOAD_REQUESTS = 10_000   # completions, each 1 token: the cheapest request that still runs the adapter in og
LOAD_CLIENTS = 6         # concurrent clients, always more than the server's generator threads (a queue forms)
SWITCH_PAUSE_S = 0.2     # between one switch's answer and the next switch


async def _hammer(url: str, versions: list[str]) -> dict[str, Any]:
    """LOAD_CLIENTS clients send LOAD_REQUESTS completions to SUPPORT while one admin client switches it between
    `versions` until they are done; every status, every adapter version that answered, every switch's seconds."""
    statuses: Counter[int] = Counter()
    answered: Counter[str] = Counter()
    failures: list[str] = []
    switches: list[float] = []
    left = LOAD_REQUESTS
    done = asyncio.Event()
    body = {"model": SUPPORT, "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0}
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=LOAD_CLIENTS + 1),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post("/v1/completions", json=body,
                                        headers={"Authorization": f"Bearer {KEY}"}) as r:
                    text = await r.text()
                    statuses[r.status] += 1
                    if r.status == 200:
                        answered[r.headers["X-Relctl-Adapter-Version"]] += 1
                    elif len(failures) < 5:
                        failures.append(f"HTTP {r.status}: {text[:300]}")

        async def switcher() -> None:
            while not done.is_set():
                version = versions[len(switches) % 2]
                async with session.post("/admin/adapters", json={"model": SUPPORT, "version": version},
                                        headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as r:
                    answer = await r.json()
                    assert r.status == 200 and answer["version"] == version, answer
                    switches.append(answer["seconds"])
                await asyncio.sleep(SWITCH_PAUSE_S)

        switching = asyncio.create_task(switcher())
        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(LOAD_CLIENTS)))
        elapsed = time.monotonic() - started
        done.set()
        await switching
    return {"statuses": statuses, "answered": answered, "failures": failures, "switches": switches,
            "seconds": elapsed}


def test_no_request_fails_while_versions_switch_under_load(story: dict[str, Any], canaried: dict[str, Any]) -> None:
    """The defect: switching v1 <-> v2 on the live base under concurrent clients gave HTTP 500 "adapter ... is
    not loaded" (a request routed to the old version, then the switch unloaded it). Now a request keeps the
    version it was routed to loaded until its job ends: >= 10,000 requests, switches all along, 0 failures."""
    url = story["server"]["url"]
    registry = Registry(resolve_store(story["project"]))
    production = registry.aliases(SUPPORT)[PRODUCTION]
    # v1 and the v2 the canary released (both servable); the last switch lands on production, as found
    versions = sorted({canaried["before"][PRODUCTION], canaried["report"]["version"]}, key=production.__eq__)
    assert len(versions) == 2 and all(registry.get_version(SUPPORT, v).tags[T.RELEASE_STATE] == "released"
                                      for v in versions), (versions, canaried["report"].get("canary"))
    run = asyncio.run(_hammer(url, versions))
    switches = sorted(run["switches"])
    print(f"switch under load: {sum(run['statuses'].values())} requests in {run['seconds']:.1f}s by {LOAD_CLIENTS} "
          f"clients, {len(switches)} switches; statuses {dict(run['statuses'])}; answered by {dict(run['answered'])}; "
          f"switch seconds min {switches[0]:.3f} median {switches[len(switches) // 2]:.3f} max {switches[-1]:.3f}")
    assert run["statuses"] == Counter({200: LOAD_REQUESTS}), run["failures"]
    assert len(switches) >= 20 and set(run["answered"]) == set(versions)   # both versions served, many times over
    if len(switches) % 2:   # the last switch went to the other version: back to production
        assert switch(url, SUPPORT, production).status_code == 200
    listing = httpx.get(f"{url}/admin/adapters", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30).json()
    assert {a["served_name"]: a["version"] for a in listing["adapters"]}[SUPPORT] == production
    # Nothing in flight any more: the replaced version was unloaded once its last request ended.
    assert listing["draining"] == {}, listing
    assert story["server_proc"].poll() is None and story["server_proc"].pid == story["server"]["pid"]


def test_a_rejected_version_is_never_switched_to(story: dict[str, Any]) -> None:
    """POST /admin/adapters for a version whose release state is rejected: 409 naming the rule, nothing served
    changes (the state rules of alias moves: release/registry/states.py)."""
    url = story["server"]["url"]
    registry = Registry(resolve_store(story["project"]))
    other = f"{BASE}-other"
    version = registry.aliases(other)[PRODUCTION]
    state = registry.get_version(other, version).tags[T.RELEASE_STATE]
    registry.set_version_tag(other, version, T.RELEASE_STATE, "rejected")
    try:
        refused = switch(url, other, version)
        pinned = httpx.post(f"{url}/admin/adapters", json={"model": f"{other}:{version}"}, timeout=60,
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    finally:
        registry.set_version_tag(other, version, T.RELEASE_STATE, state)
    for answer in (refused, pinned):
        assert answer.status_code == 409 and "it is rejected" in answer.json()["error"]["message"], answer.text
    # A completions key cannot switch at all.
    as_client = httpx.post(f"{url}/admin/adapters", json={"model": other}, timeout=60,
                           headers={"Authorization": f"Bearer {KEY}"})
    assert as_client.status_code == 403, as_client.text


def test_every_way_a_request_ends_gives_its_adapter_back(story: dict[str, Any]) -> None:
    """A lease is taken when a request is routed to an adapter and given back however the request ends:
    streamed to the end, left by its client after the first chunk, answered whole, refused after routing."""
    url, auth = story["server"]["url"], {"Authorization": f"Bearer {KEY}"}
    body = {"model": SUPPORT, "prompt": PROMPTS[0], "max_tokens": 100, "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=auth, timeout=60) as r:
        assert r.status_code == 200 and list(r.iter_lines())[-2:] == ["data: [DONE]", ""]
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=auth, timeout=60) as r:
        assert r.status_code == 200 and next(r.iter_lines()).startswith("data: ")   # then the client leaves
    assert httpx.post(f"{url}/v1/completions", json=body, headers=auth, timeout=60).status_code == 200
    refused = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 100_000}, headers=auth, timeout=60)
    assert refused.status_code == 400 and "max_tokens" in refused.text
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    deadline = time.monotonic() + 60
    while (in_flight := httpx.get(f"{url}/admin/adapters", headers=admin, timeout=30).json()["in_flight"]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)   # the left stream's job stops at its next token
    assert in_flight == {}


def test_a_replaced_version_stays_loaded_for_the_request_holding_it(story: dict[str, Any], canaried: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    """The table and the engine in process (og on the story's int4 base): a request holding v_old keeps it
    loaded across a switch and generates with it; the engine unloads it once that request's job has ended;
    a switch back to a version still draining takes it back without a second load (og would refuse one)."""
    project = story["project"]
    old_v, new_v = canaried["before"][PRODUCTION], canaried["report"]["version"]
    old, new = engine_name(SUPPORT, old_v), engine_name(SUPPORT, new_v)
    base = resolve_package(f"{BASE}/1", project)
    fetch = registry_fetch(Registry(resolve_store(project)), BaseIdentity.of_package(base.manifest, BASE, "1"),
                           tmp_path / "cache", project_trust(project), print)
    engine = open_engine(base.manifest, ServerSettings(batching="off"), {})
    table = AdapterTable(engine.runner, fetch)  # type: ignore[arg-type]
    try:
        table.switch(SUPPORT, old_v)
        lease = table.acquire(SUPPORT)
        assert lease is not None and lease.adapter.version == old_v
        table.switch(SUPPORT, new_v)
        assert table.draining() == {old: 1} and table.loaded() == sorted([old, new])

        async def cancelled_after_first_piece() -> str | Finished:
            params = GenerationParams(max_tokens=60, temperature=0.0, top_p=1.0, top_k=0, seed=None, stop=(),
                                      ignore_eos=True)
            events = engine.generate(engine.encode(PROMPTS[0]), params, time.monotonic() + 60, adapter=old,
                                     on_end=lease.release)
            first = await anext(events)
            await events.aclose()
            return first

        assert isinstance(asyncio.run(cancelled_after_first_piece()), str)   # v_old still generates
        deadline = time.monotonic() + 60
        while old in table.loaded() and time.monotonic() < deadline:
            time.sleep(0.05)   # the cancelled job ends at its next token, then the unload thread runs
        assert table.loaded() == [new] and table.draining() == {}
        held = table.acquire(SUPPORT)
        table.switch(SUPPORT, old_v)
        assert held is not None and table.draining() == {new: 1}
        table.switch(SUPPORT, new_v)   # back while it drains: no load (og refuses a name it holds)
        assert table.draining() == {} and table.loaded() == [new]   # v_old had no request: unloaded at once
        held.release()
        assert table.in_flight() == {} and table.loaded() == [new]
    finally:
        table.close()
        engine.close()
