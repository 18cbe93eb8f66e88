"""Benchmark: the example on three engines (onnxruntime-genai, vLLM, llama.cpp), same prompts, same seeded
load plan, in one promote.

The example's recipe is trained at hidden 256 with 4 heads (`every_engine()`, head_dim 64: vLLM's CPU attention
takes 64 or 128, tests/backends/test_vllm.py) so every engine serves the same model. One `relctl promote
--dry-run` with release.yaml's `engines:` builds, validates (against each engine's fp32 reference, the
example's thresholds) and load-tests each entry with the example's load gate (its traffic, SLOs and price),
swept to the highest rate that meets the SLOs, the best step sent once more (the repeat noise of the tie
rule); `convert.backend: auto` then takes the cheapest that met quality and the SLOs. The numbers are the
release report's own `engines` block (release/pipeline/engines.py); the benchmark also checks that the
report, the model card (the release run's report/model_card.md) and the job summary (`--summary`) each show
one table row per entry, with the `limited by` column. The load average is sampled through the run: the
machine is shared, and every rate in the table is a rate on shared cores.

vLLM runs from its own environment: RELCTL_VLLM_PYTHON (e.g. /work/main/.venv-vllm/bin/python), else the
project's .venv-vllm (`make vllm-env`); llama.cpp from `make llama-cpp-env`. llama-server runs one thread
(`--llama-threads`, RELCTL_LLAMA_CPP_THREADS): on 2 oversubscribed cores ggml's spinning worker threads made
5 sequential requests take 18-42 s at llama.cpp's default against 0.6-0.8 s with one thread (measured
here), which would rank the machine's load, not the engine.

    python benchmarks/engines.py                     # about 10 minutes on 2 shared cores
    python benchmarks/engines.py --step-duration 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's relctl, as the other benchmarks
EXAMPLE = ROOT / "examples" / "tiny-llm"
RESULTS = Path(__file__).parent / "results" / "engines.json"
RELCTL = Path(sys.executable).parent / "relctl"
ENGINES = [{"backend": "onnxruntime-genai", "precision": "int4"},
           {"backend": "onnxruntime-genai", "precision": "fp32"},
           {"backend": "vllm", "precision": "fp32"},
           {"backend": "llama-cpp", "precision": "q8_0"}]
THREADS_ENV = "RELCTL_LLAMA_CPP_THREADS"


def _module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def trained_run(project: Path, steps: dict[str, int]) -> str:
    """The example's recipe at head_dim 64, logged as the example logs it; returns the run id. `steps`: fewer
    training steps than the recipe's (the engines are compared on the model, not judged on its task)."""
    tinyllm = _module("tinyllm", EXAMPLE / "tinyllm.py")
    train = _module("tiny_llm_train", EXAMPLE / "train.py")
    config = tinyllm.every_engine(**steps)
    result = tinyllm.train_tiny_llm(project / "training", config)
    return str(train.log_run(result, project, experiment="tiny-llm"))


def release_yaml(step_duration_s: float, requests: int) -> dict[str, Any]:
    example = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    load = dict(example["gates"]["load"])
    # The highest SLO-meeting rate, doubling from the example's rate: cost at a fixed offered rate would only
    # price the offered load (equal on every engine that keeps up), not the engine.
    load |= {"sweep": True, "step_duration_s": step_duration_s}
    load["traffic"] = {**load["traffic"], "requests": requests}
    return {"model": "tiny-llm", "convert": {"backend": "auto"}, "validation": example["validation"],
            "engines": ENGINES, "gates": {"load": load},
            "signing": False}  # a dry run registers nothing: there is nothing to sign


class LoadSampler:
    """The 1-minute load average every `every_s` seconds while the promote runs (the machine is shared)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float | int]:
        if not self.samples:
            return {"samples": 0}
        return {"samples": len(self.samples), "mean": round(sum(self.samples) / len(self.samples), 2),
                "max": round(max(self.samples), 2), "min": round(min(self.samples), 2)}


def shown_everywhere(report: dict[str, Any], card: str, summary: str) -> dict[str, Any]:
    """Whether the report has one row per entry and the card and the job summary one table line per entry."""
    rows = [(r["engine"], r["precision"]) for r in (report.get("engines") or {}).get("rows", [])]
    wanted = [(e["backend"], e["precision"]) for e in ENGINES]

    def lines(text: str) -> dict[str, bool]:
        found = {f"{e} {p}": f"| {e} | {p} |" in text for e, p in wanted}
        return found | {"limited by column": "| limited by |" in text}

    return {"report_rows": rows == wanted, "model_card": lines(card), "job_summary": lines(summary)}


def release_card(project: Path, release_run: str, env: dict[str, str]) -> str:
    """The model card the promote logged on its release run (report/model_card.md), read from its MLflow store."""
    code = ("import sys; from pathlib import Path; from release.registry import Registry; "
            "from release.registry.store import resolve_store; "
            "r = Registry(resolve_store(Path(sys.argv[1]))); "
            "print(Path(r.client.download_artifacts(sys.argv[2], 'report/model_card.md')).read_text())")
    done = subprocess.run([sys.executable, "-c", code, str(project), release_run], capture_output=True, text=True,
                          env=env, check=False)
    return done.stdout if done.returncode == 0 else f"(no card: {done.stderr[-500:]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-duration", type=float, default=4.0, help="seconds per sweep step")
    parser.add_argument("--requests", type=int, default=200, help="requests per sweep step")
    parser.add_argument("--train-steps", type=int, nargs=2, metavar=("BASE", "LORA"),
                        help="train briefly (the test's 30 10) instead of the recipe's steps")
    parser.add_argument("--llama-threads", default="1",
                        help=f"llama-server's --threads ({THREADS_ENV}; 'default': llama.cpp's own)")
    args = parser.parse_args()
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("MLFLOW_TRACKING_URI", None)
    if args.llama_threads != "default":
        env[THREADS_ENV] = args.llama_threads
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        steps = {} if not args.train_steps else {"base_steps": args.train_steps[0], "lora_steps": args.train_steps[1]}
        run_id = trained_run(project, steps)
        config = release_yaml(args.step_duration, args.requests)
        (project / "release.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (project / "traffic.jsonl").write_text((EXAMPLE / "traffic.jsonl").read_text())
        started = time.monotonic()
        summary_path = project / "summary.md"
        with LoadSampler() as load:
            promote = subprocess.run([str(RELCTL), "--project-dir", str(project), "promote", run_id, "--dry-run",
                                      "--json", "--summary", str(summary_path)],
                                     capture_output=True, text=True, env=env, check=False)
        seconds = time.monotonic() - started
        if not promote.stdout.strip():
            raise SystemExit(f"promote wrote no report (exit {promote.returncode}): {promote.stderr[-3000:]}")
        report = json.loads(promote.stdout)
        summary = summary_path.read_text() if summary_path.is_file() else ""
        card = release_card(project, str(report.get("release_run")), env)
        shown = shown_everywhere(report, card, summary)
    from release.pipeline.engines import engines_table  # the report's own table

    engines = report.get("engines") or {}
    out = {"benchmark": "the example (head_dim 64) on onnxruntime-genai, vLLM and llama.cpp: one promote, same "
                        "prompts and seeded load plan, cost at the highest SLO-meeting rate",
           "outcome": report.get("outcome"), "exit_code": promote.returncode, "failures": report.get("failures"),
           "engines": engines, "table": engines_table(engines) if engines else [],
           "shown": shown, "promote_seconds": round(seconds, 1),
           "training": steps or "the recipe's steps", "requests_per_step": args.requests,
           "engine_settings": {THREADS_ENV: env.get(THREADS_ENV, "llama.cpp's default")},
           "machine": {"cpus": os.cpu_count(), "shared": "yes: other jobs ran on the same cores",
                       "loadavg_before": load_before, "loadavg_during_1min": load.summary(),
                       "loadavg_after": os.getloadavg()},
           "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print("\n".join([*out["table"], "", *(engines.get("why") or []), "", f"shown: {shown}"]))
    if promote.returncode not in (0, 1):
        raise SystemExit(f"promote failed (exit {promote.returncode}): {promote.stderr[-3000:]}")


if __name__ == "__main__":
    main()
