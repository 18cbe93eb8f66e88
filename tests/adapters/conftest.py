"""The vLLM adapter story, once per package (tests/adapters): the example's base released as tiny-llm v1 on
vLLM (head_dim 64, vLLM's CPU attention), two adapters released onto tiny-llm@production without merging, and
`relctl serve tiny-llm@production --adapters` running with both. Modules that use it read the registry and
the server; a test that adds versions reads their numbers from its own output, never assumes them.

vLLM starts once per release (validation) and once for the server: minutes on 2 shared cores (slow).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.numpy import load_file, save_file

from tests.conftest import load_tinyllm, load_train_module

BASE = "tiny-llm"
RELCTL = str(Path(sys.executable).with_name("relctl"))
KEY = "adapter-completions-key"  # what completion clients send (--api-key, RELCTL_API_KEY)
ADMIN_KEY = "adapter-admin-key"  # what switches adapters (--admin-key, RELCTL_ADMIN_KEY)
PROMPTS = ["reverse b d a f ->", "reverse c a e b ->", "reverse f e d c ->"]


def relctl(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELCTL, "--project-dir", str(project), *args], capture_output=True, text=True,
                          env=env or dict(os.environ), timeout=1800)


def variant(result: Any, folder: Path, scale: float | None) -> Any:
    """The run's checkpoint, base only (scale None) or with its LoRA B matrices scaled: another adapter of
    the same base (negated: answers that differ from the trained one)."""
    shutil.copytree(result.data_dir, folder)
    ckpt = folder / "checkpoint"
    adapter = ckpt / "adapter_model.safetensors"
    if scale is None:
        adapter.unlink()
        (ckpt / "adapter_config.json").unlink()
    else:
        tensors = load_file(adapter)
        save_file({k: (v * scale if "lora_B" in k else v) for k, v in tensors.items()}, adapter)
    return replace(result, checkpoint_dir=ckpt, data_dir=folder)


def answers(url: str, model: str, key: str = KEY) -> tuple[list[str], dict[str, str]]:
    """Greedy answers to PROMPTS from `model` on the server at `url`, and the last answer's headers."""
    texts, headers = [], {}
    for prompt in PROMPTS:
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 6,
                                                       "temperature": 0}, timeout=120,
                       headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
        headers = dict(r.headers)
    return texts, headers


@pytest.fixture(scope="package")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tinyllm, train = load_tinyllm(), load_train_module()
    root = tmp_path_factory.mktemp("adapters")
    project = root / "project"
    project.mkdir()
    (project / "release.yaml").write_text("model: tiny-llm\nconvert:\n  backend: vllm\n  precision: fp32\n")
    trained = tinyllm.train_tiny_llm(root / "trained", tinyllm.every_engine(base_steps=12, lora_steps=12))
    runs = {
        "base": train.log_run(variant(trained, root / "base", None), project, experiment=BASE),
        "support": train.log_run(trained, project, experiment="support"),
        "support-v2": train.log_run(variant(trained, root / "neg", -1.0), project, experiment="support"),
        "other": train.log_run(variant(trained, root / "half", 0.5), project, experiment="other"),
    }
    out: dict[str, Any] = {"project": project, "runs": runs, "timings": {}}
    out["base"] = relctl(project, "promote", runs["base"], "--json")
    assert out["base"].returncode == 0, out["base"].stderr[-2000:]
    for key, run in (("support", runs["support"]), ("other", runs["other"])):
        started = time.monotonic()
        out[key] = relctl(project, "promote", run, "--onto", f"{BASE}@production", "--json")
        out["timings"][f"release {key}"] = round(time.monotonic() - started, 1)
    ready = root / "ready.json"
    env = {**os.environ, "RELCTL_API_KEY": KEY, "RELCTL_ADMIN_KEY": ADMIN_KEY}
    server = subprocess.Popen([RELCTL, "serve", f"{BASE}@production", "--adapters", "--port", "0", "--project-dir",
                               str(project), "--ready-file", str(ready)], env=env, stdout=subprocess.DEVNULL,
                              stderr=open(root / "serve.log", "wb"))
    try:
        deadline = time.monotonic() + 900
        while not ready.is_file():
            assert server.poll() is None and time.monotonic() < deadline, (root / "serve.log").read_text()[-2000:]
            time.sleep(1)
        out["server"] = json.loads(ready.read_text())
        out["server_proc"] = server
        out["env"] = env
        yield out
    finally:
        server.terminate()
        server.wait(60)
    print("adapter story timings:", out["timings"])
