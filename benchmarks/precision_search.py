"""Benchmark: `precision: auto` on the example, the search's wall time against the sum of its parts.

Trains the example (examples/tiny-llm, the default recipe), logs it as the example does, and runs one
`relctl promote --dry-run` with examples/tiny-llm/release-auto.yaml: every variant onnxruntime-genai's
installed builder makes on this CPU is built, validated against the one fp32 reference, evaluated sample by
sample against that reference, and load-tested on the same seeded plan (only the variants that passed).
The search measures its own wall time and each part in the same run (the release report's
`engines.precision_search.cost`): each build (convert, validate, memory, package), the reference's eval
scoring, each variant's paired eval and each load test. Goal (issue 38): the search's wall time at most 1.2x
the sum of its builds and evals, the load tests counted as evals (the $/M cost is what they evaluate); the
ratio without them is recorded beside it. The fp32 reference is scored once per release: the report's
`reference_scoring` counts it (the search scores it, the release's own eval gate reuses it).

    nice -n 10 python benchmarks/precision_search.py      # about 10 minutes on 2 shared cores
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's relctl, as the other benchmarks
EXAMPLE = ROOT / "examples" / "tiny-llm"
RESULTS = Path(__file__).parent / "results" / "precision_search.json"
RELCTL = Path(sys.executable).parent / "relctl"
TARGET_RATIO = 1.2


def _module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def trained_run(project: Path) -> str:
    tinyllm = _module("tinyllm", EXAMPLE / "tinyllm.py")
    train = _module("tiny_llm_train", EXAMPLE / "train.py")
    result = tinyllm.train_tiny_llm(project / "training", tinyllm.TrainConfig())
    return str(train.log_run(result, project, experiment="tiny-llm"))


def main() -> None:
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("MLFLOW_TRACKING_URI", None)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        run_id = trained_run(project)
        shutil.copy(EXAMPLE / "release-auto.yaml", project / "release.yaml")
        shutil.copy(EXAMPLE / "traffic.jsonl", project / "traffic.jsonl")
        subprocess.run([str(RELCTL), "--project-dir", str(project), "keygen"], capture_output=True, env=env,
                       check=True)  # every release is signed: the project's own key pair
        started = time.monotonic()
        promote = subprocess.run([str(RELCTL), "--project-dir", str(project), "promote", run_id, "--dry-run",
                                  "--json"], capture_output=True, text=True, env=env, check=False)
        seconds = time.monotonic() - started
        if not promote.stdout.strip():
            raise SystemExit(f"promote wrote no report (exit {promote.returncode}): {promote.stderr[-3000:]}")
        report = json.loads(promote.stdout)
    engines = report.get("engines") or {}
    search = engines.get("precision_search") or {}
    cost = search.get("cost") or {}
    ratio = cost.get("ratio_with_load_tests")
    scoring = report.get("reference_scoring") or {}
    out = {"benchmark": "precision: auto on the example (examples/tiny-llm/release-auto.yaml): the search's wall "
                        "time against the sum of its builds and evals (load tests included), measured in the same "
                        "run; the fp32 reference's eval scorings counted in the report",
           "outcome": report.get("outcome"), "exit_code": promote.returncode, "failures": report.get("failures"),
           "chosen": engines.get("chosen"), "search_wall_s": cost.get("wall_s"),
           "builds_s": cost.get("builds_s"), "evals_s": cost.get("evals_s"), "load_tests_s": cost.get("load_tests_s"),
           "ratio": ratio, "target_ratio": TARGET_RATIO, "within_target": ratio is not None and ratio <= TARGET_RATIO,
           "ratio_without_load_tests": cost.get("ratio"),
           "reference_scorings": scoring.get("scorings"), "reference_reused": scoring.get("reused"),
           "reference_scoring": scoring, "parts": cost.get("parts"), "frontier": search.get("frontier"),
           "why": engines.get("why"), "promote_seconds": round(seconds, 1),
           "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("outcome", "chosen", "search_wall_s", "ratio", "ratio_without_load_tests",
                                          "reference_scorings")}, indent=2))
    sys.stderr.write(promote.stderr[-6000:])  # the promote's own progress lines, as a user sees them
    if promote.returncode not in (0, 1):
        raise SystemExit(f"promote failed (exit {promote.returncode}): {promote.stderr[-3000:]}")


if __name__ == "__main__":
    main()
