"""Benchmark: how long relctl's commands take, each against its floor, side by side in one run.

    relctl --help                       vs  python -c "import click"
    relctl status MODEL                 vs  MlflowClient doing the same reads (the model, then per alias its
                                            version, its release run and its LoggedModel when it has one, and
                                            the one search for adapters built for the model)
    relctl history MODEL                vs  MlflowClient reading the registered model (its tags hold the history)
    relctl check RUN  (refused)         vs  python -c "import mlflow"
    relctl promote RUN (refused)        vs  python -c "import mlflow"

RUN is a checkpoint-only training run (no validation prompts): both commands must refuse it, exit 2. MODEL
has two versions registered the way relctl registers them (a real package logged to a release run, an
alias history of two promotes) in an embedded SQLite store in a temporary project.

Every command runs in a fresh interpreter, timed from the parent: wall clock (interpreter start included)
and CPU seconds (user + system of the child, which a shared machine's load disturbs far less). Each command
runs back to back with its floor, in alternating order, and is compared with it within the round, so a busy
moment falls on both; the medians over --rounds (5) of those comparisons go to
benchmarks/results/cli_latency.json with the targets: `--help` within 0.3 s of its floor, the read commands
within 1.2x of theirs, a refused run within 2 s of importing mlflow.

    python benchmarks/cli_latency.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "cli_latency.json"
MODEL = "tiny-llm"
RELCTL = [sys.executable, "-c", "from release.cli import main; main()"]

FLOOR_STATUS = """
import sys
from mlflow import MlflowClient
uri, name = sys.argv[1], sys.argv[2]
client = MlflowClient(tracking_uri=uri, registry_uri=uri)
model = client.get_registered_model(name)
for alias, version in sorted(model.aliases.items()):
    mv = client.get_model_version(name, version)
    client.get_run(mv.tags["relctl.release_run_id"])
    if getattr(mv, "model_id", None):
        client.get_logged_model(mv.model_id)
client.search_model_versions(f"tags.`relctl.kind` = 'adapter' and tags.`relctl.base_model` = '{name}'")
"""

FLOOR_HISTORY = """
import json, sys
from mlflow import MlflowClient
uri, name = sys.argv[1], sys.argv[2]
tags = MlflowClient(tracking_uri=uri, registry_uri=uri).get_registered_model(name).tags
history = [json.loads(v) for k, v in sorted(tags.items()) if k.startswith("relctl.history.")]
"""


def make_project(project: Path) -> tuple[str, str]:
    """Two registered versions of MODEL and a checkpoint-only run; returns (tracking URI, run id)."""
    sys.path.insert(0, str(REPO))
    import mlflow

    from release.backends import backend_for_folder
    from release.core.hashing import sha256_file
    from release.core.package import MANIFEST, build_package
    from release.registry import Registry
    from release.registry import tags as T
    from release.registry.store import connect, ensure_experiment, resolve_store
    from release.registry.transitions import promote

    store = resolve_store(project)
    connect(store)
    registry = Registry(store)
    work = project / "inputs"
    for n in (1, 2):
        runtime, source = work / f"rt{n}", work / f"src{n}"
        runtime.mkdir(parents=True)
        source.mkdir(parents=True)
        (runtime / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "n": n}}))
        (runtime / "model.onnx").write_bytes(bytes([n]) * 128)
        (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
        package = build_package(work / f"pkg{n}", runtime, source, {"model_name": MODEL, "precision": "fp32"},
                                backend_for_folder(runtime))
        mlflow.set_experiment(experiment_id=ensure_experiment(store, "relctl-releases"))
        with mlflow.start_run() as run:
            mlflow.log_artifacts(str(package.root), "package")
        registry.ensure_model(MODEL, "benchmark")
        tags = {T.RELEASE_RUN: run.info.run_id, T.MANIFEST_SHA256: sha256_file(package.root / MANIFEST)}
        mv = registry.create_version(MODEL, run.info.artifact_uri + "/package", run.info.run_id, tags, f"v{n}")
        promote(registry, MODEL, str(mv.version), f"release {n}", run.info.run_id)
    checkpoint = work / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    (checkpoint / "tokenizer.json").write_text("{}")
    mlflow.set_experiment(experiment_id=ensure_experiment(store, "training"))
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(checkpoint), "checkpoint")
    return store.tracking_uri, run.info.run_id


def timed(argv: list[str], env: dict[str, str], expect: int) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one fresh interpreter running `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expect:
        raise SystemExit(f"{argv[-3:]}: exit {proc.returncode}, expected {expect}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# (command, its floor, how they compare, the target): the comparison is made within each round, command and
# floor run back to back (in alternating order), and the target applies to the median over rounds.
PAIRS = (
    ("help", "floor_import_click", "minus", 0.3),
    ("status", "floor_status_reads", "over", 1.2),
    ("history", "floor_history_read", "over", 1.2),
    ("check_refused", "floor_import_mlflow", "minus", 2.0),
    ("promote_refused", "floor_import_mlflow", "minus", 2.0),
)


def compare(a: float, b: float, how: str) -> float:
    return a - b if how == "minus" else a / b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        uri, run_id = make_project(project)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        at = ["--project-dir", str(project)]
        cases: dict[str, tuple[list[str], int]] = {
            "floor_import_click": ([sys.executable, "-c", "import click"], 0),
            "help": ([*RELCTL, "--help"], 0),
            "floor_status_reads": ([sys.executable, "-c", FLOOR_STATUS, uri, MODEL], 0),
            "status": ([*RELCTL, *at, "status", MODEL], 0),
            "floor_history_read": ([sys.executable, "-c", FLOOR_HISTORY, uri, MODEL], 0),
            "history": ([*RELCTL, *at, "history", MODEL], 0),
            "floor_import_mlflow": ([sys.executable, "-c", "import mlflow"], 0),
            "check_refused": ([*RELCTL, *at, "check", run_id], 2),
            "promote_refused": ([*RELCTL, *at, "-q", "promote", run_id], 2),
        }
        load_before = os.getloadavg()
        wall: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        paired: dict[str, dict[str, list[float]]] = {cmd: {"wall": [], "cpu": []} for cmd, *_ in PAIRS}
        for round_no in range(args.rounds):
            for cmd, floor, how, _ in PAIRS:
                order = (floor, cmd) if round_no % 2 == 0 else (cmd, floor)
                got = {name: timed(cases[name][0], env, cases[name][1]) for name in order}
                for name, (w, c) in got.items():
                    wall[name].append(w)
                    cpu[name].append(c)
                paired[cmd]["wall"].append(compare(got[cmd][0], got[floor][0], how))
                paired[cmd]["cpu"].append(compare(got[cmd][1], got[floor][1], how))
        load_after = os.getloadavg()
    targets: dict[str, Any] = {}
    for cmd, floor, how, limit in PAIRS:
        on_wall = statistics.median(paired[cmd]["wall"])
        on_cpu = statistics.median(paired[cmd]["cpu"])
        targets[cmd] = {"floor": floor, "measure": f"{cmd} {'-' if how == 'minus' else '/'} {floor}",
                        "target": f"<= {limit}{' s' if how == 'minus' else 'x'}", "wall": round(on_wall, 3),
                        "cpu": round(on_cpu, 3), "met_wall": on_wall <= limit, "met_cpu": on_cpu <= limit}
    result: dict[str, Any] = {
        "benchmark": "cli_latency",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in load_after]},
        "rounds": args.rounds,
        "median_wall_s": {name: round(statistics.median(v), 3) for name, v in wall.items()},
        "median_cpu_s": {name: round(statistics.median(v), 3) for name, v in cpu.items()},
        "targets": targets,
        "samples_wall_s": {name: [round(x, 3) for x in v] for name, v in wall.items()},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for name in cases:
        print(f"{name:24s} wall {result['median_wall_s'][name]:7.3f} s   cpu {result['median_cpu_s'][name]:7.3f} s")
    for info in targets.values():
        print(f"{info['measure']:44s} wall {info['wall']:7.3f}  cpu {info['cpu']:7.3f}  (target {info['target']}: "
              f"{'met' if info['met_wall'] else 'MISSED'} on wall, {'met' if info['met_cpu'] else 'MISSED'} on cpu)")


if __name__ == "__main__":
    main()
