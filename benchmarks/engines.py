"""Benchmark: the example on both engines (onnxruntime-genai and vLLM), same prompts, same seeded load plan.

The example's recipe is trained at hidden 256 with 4 heads (head_dim 64: vLLM's CPU attention takes 64 or
128, tests/backends/test_vllm.py) so both engines serve the same model. One `relctl promote --dry-run`
with release.yaml's `engines:` builds, validates (against each engine's fp32 reference, the example's
thresholds) and load-tests each entry with the example's load gate (its traffic, SLOs and price), swept
to the highest rate that meets the SLOs; `convert.backend: auto` then takes the cheapest that met quality
and the SLOs. The numbers are the release report's own `engines` block (release/pipeline/engines.py).

vLLM runs from its own environment: RELCTL_VLLM_PYTHON (e.g. /work/main/.venv-vllm/bin/python), else the
project's .venv-vllm (`make vllm-env`).

    python benchmarks/engines.py                     # about 8 minutes on 2 shared cores
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
           {"backend": "vllm", "precision": "fp32"}]


def _module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def trained_run(project: Path) -> str:
    """The example's recipe at head_dim 64, logged as the example logs it; returns the run id."""
    tinyllm = _module("tinyllm", EXAMPLE / "tinyllm.py")
    train = _module("tiny_llm_train", EXAMPLE / "train.py")
    config = tinyllm.every_engine()
    result = tinyllm.train_tiny_llm(project / "training", config)
    return str(train.log_run(result, project, experiment="tiny-llm"))


def release_yaml(step_duration_s: float) -> dict[str, Any]:
    example = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    load = dict(example["gates"]["load"])
    # The highest SLO-meeting rate, doubling from the example's rate: cost at a fixed offered rate would only
    # price the offered load (equal on every engine that keeps up), not the engine.
    load |= {"sweep": True, "step_duration_s": step_duration_s}
    load["traffic"] = {**load["traffic"], "requests": 200}
    return {"model": "tiny-llm", "convert": {"backend": "auto"}, "validation": example["validation"],
            "engines": ENGINES, "gates": {"load": load}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-duration", type=float, default=4.0, help="seconds per sweep step")
    args = parser.parse_args()
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("MLFLOW_TRACKING_URI", None)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        run_id = trained_run(project)
        config = release_yaml(args.step_duration)
        (project / "release.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (project / "traffic.jsonl").write_text((EXAMPLE / "traffic.jsonl").read_text())
        started = time.monotonic()
        promote = subprocess.run([str(RELCTL), "--project-dir", str(project), "promote", run_id, "--dry-run",
                                  "--json"], capture_output=True, text=True, env=env, check=False)
        seconds = time.monotonic() - started
        if not promote.stdout.strip():
            raise SystemExit(f"promote wrote no report (exit {promote.returncode}): {promote.stderr[-3000:]}")
        report = json.loads(promote.stdout)
    from release.pipeline.engines import engines_table  # the report's own table

    engines = report.get("engines") or {}
    out = {"benchmark": "the example (head_dim 64) on onnxruntime-genai and vLLM: one promote, same prompts and "
                        "seeded load plan, cost at the highest SLO-meeting rate",
           "outcome": report.get("outcome"), "exit_code": promote.returncode, "failures": report.get("failures"),
           "engines": engines, "table": engines_table(engines) if engines else [],
           "promote_seconds": round(seconds, 1),
           "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print("\n".join([*out["table"], "", *(engines.get("why") or [])]))
    if promote.returncode not in (0, 1):
        raise SystemExit(f"promote failed (exit {promote.returncode}): {promote.stderr[-3000:]}")


if __name__ == "__main__":
    main()
