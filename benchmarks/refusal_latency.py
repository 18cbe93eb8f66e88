"""Benchmark: a refusal that needs no registry and no model, against `relctl --help` in the same run (issue 39:
such refusals took 15-28 s on a loaded machine against 0.9 s for --help, importing MLflow before reading
release.yaml; the goal is at most 2x --help).

    relctl promote RUN --precision int9        (a bad flag value)
    relctl promote RUN   with release.yaml's convert.precision: int5
    relctl check RUN     with release.yaml's convert.precision: int5
    relctl promote RUN --config missing.yaml   (a missing release.yaml)

Each must exit 2 with an error line. Every command runs in a fresh interpreter, timed from the parent (wall
clock, interpreter start included), back to back with `relctl --help` in alternating order, round by
round, so a busy moment falls on both; the median over --rounds of each refusal's time over its round's
--help goes to benchmarks/results/refusal_latency.json, with the heavy modules (mlflow, torch,
onnxruntime, numpy...) each refusal imported (from `python -X importtime`).

    python benchmarks/refusal_latency.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "refusal_latency.json"
HEAVY = ("mlflow", "torch", "onnxruntime", "onnxruntime_genai", "onnx", "transformers", "pandas", "numpy")
RELCTL = [sys.executable, "-c", "from release.cli import main; main()"]


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, str]:
    started = time.perf_counter()
    done = subprocess.run([*RELCTL, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, done.returncode, done.stderr


def heavy_imports(args: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "from release.cli import main; main()", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, check=False)
    names = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return sorted(m for m in HEAVY if m in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory(prefix="relctl-refusal-") as tmp:
        good, bad = Path(tmp) / "good", Path(tmp) / "bad"
        good.mkdir()
        bad.mkdir()
        (good / "release.yaml").write_text("model: m\nconvert:\n  precision: int4\n")
        (bad / "release.yaml").write_text("model: m\nconvert:\n  precision: int5\n")
        cases = {"promote --precision int9": (good, ["promote", "0" * 32, "--precision", "int9"]),
                 "promote, release.yaml precision int5": (bad, ["promote", "0" * 32]),
                 "check, release.yaml precision int5": (bad, ["check", "0" * 32]),
                 "promote --config missing.yaml": (good, ["promote", "0" * 32, "--config", "missing.yaml"])}
        ratios: dict[str, list[float]] = {name: [] for name in cases}
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        helps: list[float] = []
        errors: dict[str, str] = {}
        for round_ in range(args.rounds):
            for name, (cwd, argv) in cases.items():
                pair = [("help", ["--help"]), ("case", argv)]
                if round_ % 2:
                    pair.reverse()
                took: dict[str, float] = {}
                for which, a in pair:
                    s, rc, err = timed(a, cwd, env)
                    took[which] = s
                    if which == "case":
                        assert rc == 2 and "error:" in err, (name, rc, err)
                        errors[name] = next(line for line in err.splitlines() if line.startswith("error:"))
                helps.append(took["help"])
                seconds[name].append(took["case"])
                ratios[name].append(took["case"] / took["help"])
        out = {"machine": {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)},
               "rounds": args.rounds, "goal": "each refusal <= 2x relctl --help (median over rounds)",
               "help_s_median": round(statistics.median(helps), 3),
               "refusals": {name: {"seconds_median": round(statistics.median(seconds[name]), 3),
                                   "over_help_median": round(statistics.median(ratios[name]), 2),
                                   "holds": statistics.median(ratios[name]) <= 2.0,
                                   "error": errors[name],
                                   "heavy_imports": heavy_imports(cases[name][1], cases[name][0], env)}
                            for name in cases}}
    print(json.dumps(out, indent=2))
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
