"""The README's own-run path, as a new user follows it: an empty folder, no tracking server, `relctl init .`,
the README's logging snippet copied verbatim (found by its marker), then check and promote to a released version.
Every step is a separate process, as in a shell."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
REPO = README.parent
MARKER = "<!-- relctl:own-run-snippet -->"
RELCTL = Path(sys.executable).parent / "relctl"


def readme_snippet() -> str:
    """The python block right after the marker, character for character, as a user would copy it."""
    text = README.read_text()
    assert text.count(MARKER) == 1, "the README's own-run snippet marker is missing or repeated"
    match = re.match(r"\s*```python\n(.*?)```", text[text.index(MARKER) + len(MARKER):], re.S)
    assert match, "no python block follows the own-run snippet marker"
    return match.group(1)


def clean_env() -> dict[str, str]:
    """No tracking server and no store settings: MLflow's and relctl's defaults only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RELCTL_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def sh(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def log_run(folder: Path, env: dict[str, str], tiny_checkpoint: Path, tiny_data: Path) -> str:
    """The user's training script: the README snippet verbatim, then one call of it."""
    script = folder / "train.py"
    script.write_text(readme_snippet() + "\nprint(log_for_relctl({!r}, {!r}, {!r}, {!r}))\n".format(
        "my-model", str(tiny_checkpoint), str(tiny_data / "validation" / "prompts.jsonl"),
        str(tiny_data / "eval.jsonl")))
    done = sh([sys.executable, "train.py"], folder, env)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"[0-9a-f]{32}", run_id), done.stdout
    return run_id


def test_the_readme_path_from_an_empty_folder_ends_in_a_released_version(
        tmp_path: Path, tiny_checkpoint: Path, tiny_data: Path) -> None:
    folder = tmp_path / "my-project"
    folder.mkdir()
    env = clean_env()
    init = sh([str(RELCTL), "init", "."], folder, env)
    assert init.returncode == 0, init.stderr
    # Step 2: the export line init printed, run as a shell would.
    export = next(line.strip() for line in init.stdout.splitlines() if line.strip().startswith("export "))
    name, _, value = shlex.split(export.removeprefix("export "))[0].partition("=")
    assert name == "MLFLOW_TRACKING_URI" and value == f"sqlite:///{folder.resolve()}/.relctl/mlflow.db"
    env[name] = value
    run_id = log_run(folder, env, tiny_checkpoint, tiny_data)
    check = sh([str(RELCTL), "check", run_id], folder, env)
    assert check.returncode == 0, check.stderr
    promote = sh([str(RELCTL), "promote", run_id], folder, env)
    assert promote.returncode == 0, promote.stdout + promote.stderr
    assert "my-model v1 is production" in promote.stdout
    status = sh([str(RELCTL), "status", "my-model", "--json"], folder, env)
    assert status.returncode == 0 and '"production"' in status.stdout, status.stderr


def test_a_run_logged_to_mlflows_defaults_is_found_by_the_hint(
        tmp_path: Path, tiny_checkpoint: Path, tiny_data: Path) -> None:
    folder = tmp_path / "first-try"
    folder.mkdir()
    env = clean_env()
    assert sh([str(RELCTL), "init", "."], folder, env).returncode == 0
    run_id = log_run(folder, env, tiny_checkpoint, tiny_data)   # step 2 skipped: MLflow's ./mlflow.db
    assert (folder / "mlflow.db").is_file()
    check = sh([str(RELCTL), "check", run_id], folder, env)
    assert check.returncode == 2
    store = f"{folder.resolve()}/.relctl/mlflow.db"
    assert f"error: no MLflow store at {store}" in check.stderr
    assert not Path(store).exists()                             # a read-only command created nothing
    hint = next(line for line in check.stderr.splitlines() if line.startswith("hint: "))
    assert f"the run may be in {folder.resolve()}/mlflow.db" in hint
    # The hint's own export line points relctl at the run.
    env["MLFLOW_TRACKING_URI"] = re.search(r"export MLFLOW_TRACKING_URI=(\S+)", hint).group(1)  # type: ignore[union-attr]
    again = sh([str(RELCTL), "check", run_id], folder, env)
    assert again.returncode == 0, again.stderr


LORA_READY_BASE = """convert:
  backend: onnxruntime-genai
  precision: fp32
  onnxruntime-genai:
    adapters:
      target_modules: [all-linear]
validation:
  max_new_tokens: 8
"""


def snippet_without_digest() -> str:
    """The README snippet as a user who drops its optional digest lines (or copied it before it had them)
    would run it: the run then logs no relctl.base_sha256 tag."""
    lines = readme_snippet().splitlines(keepends=True)
    kept = [line for line in lines if "folder_base_digest" not in line]
    assert len(lines) - len(kept) == 2, "the snippet's digest import and tag line are expected"
    return "".join(kept)


@pytest.fixture(scope="module")
def readme_base(tmp_path_factory: pytest.TempPathFactory, tiny_base_only: Path, tiny_data: Path
                ) -> dict[str, Any]:
    """A project started by `relctl init`, a base released from a run logged with the README snippet, built
    LoRA-ready on onnxruntime-genai fp32 (the smallest build that serves adapters)."""
    folder = tmp_path_factory.mktemp("readme-adapter") / "project"
    folder.mkdir()
    env = clean_env()
    init = sh([str(RELCTL), "init", "."], folder, env)
    assert init.returncode == 0, init.stderr
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder.resolve()}/.relctl/mlflow.db"
    (folder / "release.yaml").write_text(LORA_READY_BASE)
    base_run = log_run(folder, env, tiny_base_only, tiny_data)
    promote = sh([str(RELCTL), "promote", base_run], folder, env)
    assert promote.returncode == 0, promote.stdout + promote.stderr[-3000:]
    return {"folder": folder, "env": env}


def log_untagged(folder: Path, env: dict[str, str], checkpoint: Path, tiny_data: Path, experiment: str) -> str:
    script = folder / f"train_{experiment}.py"
    script.write_text(snippet_without_digest() + "\nprint(log_for_relctl({!r}, {!r}, {!r}, {!r}))\n".format(
        experiment, str(checkpoint), str(tiny_data / "validation" / "prompts.jsonl"), str(tiny_data / "eval.jsonl")))
    done = sh([sys.executable, script.name], folder, env)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().splitlines()[-1]
    read = f"import mlflow; print(sorted(mlflow.MlflowClient().get_run({run_id!r}).data.tags))"
    tags = sh([sys.executable, "-c", read], folder, env)
    assert "relctl.base_sha256" not in tags.stdout, tags.stdout
    return run_id


def test_a_readme_run_without_the_digest_tag_releases_as_an_adapter(
        readme_base: dict[str, Any], tiny_checkpoint: Path, tiny_data: Path) -> None:
    """The run holds the base weights: relctl computes their digest at intake and proves the base with it."""
    folder, env = readme_base["folder"], readme_base["env"]
    run_id = log_untagged(folder, env, tiny_checkpoint, tiny_data, "support")
    check = sh([str(RELCTL), "check", run_id, "--onto", "my-model@production"], folder, env)  # promote's pre-flight
    assert check.returncode == 0, check.stdout + check.stderr
    assert "as my-model-support" in check.stdout and "computes it from the checkpoint" in check.stderr
    promote = sh([str(RELCTL), "promote", run_id, "--onto", "my-model@production", "--json"], folder, env)
    assert promote.returncode == 0, promote.stdout + promote.stderr[-3000:]
    report = json.loads(promote.stdout)
    assert report["outcome"] == "released" and report["model"] == "my-model-support", report
    assert report["base"] == {"model": "my-model", "version": "1", "sha256": report["base"]["sha256"]}
    assert "computed at intake" in promote.stderr  # said, not silent: the tag would have refused faster


def served(url: str, admin_key: str) -> dict[str, str]:
    """What a running `relctl serve --adapters` serves: served name -> version (its admin listing)."""
    listing = httpx.get(f"{url}/admin/adapters", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30)
    assert listing.status_code == 200, listing.text
    return {a["served_name"]: a["version"] for a in listing.json()["adapters"]}


def test_an_adapter_under_require_approval_waits_and_the_server_follows_the_approval(
        readme_base: dict[str, Any], tiny_checkpoint: Path, tiny_data: Path) -> None:
    """require_approval holds an adapter release as `candidate` (production unmoved, nothing served); `relctl
    approve` moves production, and the running base server loads it (it follows the registry)."""
    folder, env = readme_base["folder"], readme_base["env"]
    run_id = log_untagged(folder, env, tiny_checkpoint, tiny_data, "gated")
    (folder / "gated.yaml").write_text("require_approval: true\nvalidation:\n  max_new_tokens: 8\n")
    promote = sh([str(RELCTL), "promote", run_id, "--onto", "my-model@production", "-c", "gated.yaml", "--json"],
                 folder, env)
    assert promote.returncode == 0, promote.stdout + promote.stderr[-3000:]
    report = json.loads(promote.stdout)
    assert report["outcome"] == "awaiting-approval" and report["model"] == "my-model-gated", report
    version = report["version"]
    status = json.loads(sh([str(RELCTL), "status", "my-model-gated", "--json"], folder, env).stdout)
    assert "production" not in status["aliases"] and status["aliases"]["candidate"]["version"] == version, status
    keys = {"RELCTL_API_KEY": "approval-key", "RELCTL_ADMIN_KEY": "approval-admin"}
    ready = folder / "ready.json"
    server = subprocess.Popen([str(RELCTL), "serve", "my-model@production", "--adapters", "--port", "0",
                               "--ready-file", str(ready), "--follow-interval", "1"], cwd=folder,
                              env={**env, **keys}, stdout=subprocess.DEVNULL, stderr=open(folder / "serve.log", "wb"))
    try:
        deadline = time.monotonic() + 300
        while not ready.is_file():
            assert server.poll() is None and time.monotonic() < deadline, (folder / "serve.log").read_text()[-2000:]
            time.sleep(0.5)
        url = json.loads(ready.read_text())["url"]
        assert "my-model-gated" not in served(url, keys["RELCTL_ADMIN_KEY"])  # waiting: not production, not served
        approve = sh([str(RELCTL), "approve", f"my-model-gated/{version}", "--reason", "reviewed"], folder, env)
        assert approve.returncode == 0, approve.stdout + approve.stderr
        deadline = time.monotonic() + 120
        while served(url, keys["RELCTL_ADMIN_KEY"]).get("my-model-gated") != version:
            assert time.monotonic() < deadline, (folder / "serve.log").read_text()[-2000:]
            time.sleep(0.5)
        answer = httpx.post(f"{url}/v1/completions", json={"model": "my-model-gated", "prompt": "reverse b d a f ->",
                                                            "max_tokens": 4, "temperature": 0}, timeout=120,
                            headers={"Authorization": f"Bearer {keys['RELCTL_API_KEY']}"})
        assert answer.status_code == 200 and answer.headers["x-relctl-adapter-version"] == version, answer.text
    finally:
        server.terminate()
        server.wait(60)
