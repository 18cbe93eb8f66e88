"""Benchmark: where the seconds of `relctl rollback ADAPTER [--server URL]` go, against the floor it cannot
go below (a fresh interpreter importing what any registry command imports: MLflow's SQL stores and the
signature verifier).

    python benchmarks/adapter_rollback.py --project-dir P --model tiny-llm-support --versions 1 2 \
        [--server http://127.0.0.1:PORT] [--code DIR ...] [--rounds 3]

P is a project holding an adapter with two released versions (the adapter story of tests/adapters makes
one; its server, started with RELCTL_ADMIN_KEY, is the --server). Each round rolls the adapter to one version
and back (`--to`), each command in a fresh interpreter timed from the parent: wall clock and the child's CPU
seconds (user + system: what a busy shared machine disturbs far less), and the split the command prints
itself (`--json` "seconds": start = interpreter and imports, alias_move = package verification + the move
under the lock, switch = the load on the running base as the server measured it). `--code DIR` runs the
same commands with DIR first on the import path (e.g. a checkout of an older commit: "before"); code that
prints no split gives wall and CPU only. Medians go to benchmarks/results/adapter_rollback.json.
The project's registry is changed: production of the adapter ends where it started.
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
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "adapter_rollback.json"
RELCTL = str(Path(sys.executable).with_name("relctl"))
FLOOR = "import mlflow.store.tracking.sqlalchemy_store, mlflow.store.model_registry.sqlalchemy_store, model_signing"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """(wall seconds, child CPU seconds, the result) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result


def rollback_once(code: Path, args: argparse.Namespace, version: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    argv = [RELCTL, "--project-dir", str(args.project_dir), "rollback", args.model, "--to", version, "--json",
            "--reason", "benchmarks/adapter_rollback.py"]
    if args.server:
        argv += ["--server", args.server]
    wall, cpu, result = timed(argv, env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr[-1000:]}")
    out = json.loads(result.stdout)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), **{k: v for k, v in (out.get("seconds") or {}).items()}}


def medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = sorted({k for row in rows for k in row})
    return {k: round(statistics.median(row[k] for row in rows if k in row), 3) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-dir", type=Path, required=True)
    parser.add_argument("--model", required=True, help="the adapter's registered model")
    parser.add_argument("--versions", nargs=2, required=True, metavar=("A", "B"),
                        help="two released versions; the rollbacks alternate between them, ending on A")
    parser.add_argument("--server", default=None, help="the base server (relctl serve --adapters) to switch on")
    parser.add_argument("--code", type=Path, action="append", default=[],
                        help="another checkout to time the same way (repeatable); this one is always timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.server and not os.environ.get("RELCTL_ADMIN_KEY"):
        raise SystemExit("--server: set RELCTL_ADMIN_KEY to the server's admin key")
    codes = [REPO, *[c.resolve() for c in args.code]]
    rows: dict[str, list[dict[str, Any]]] = {str(c): [] for c in codes}
    floor: list[dict[str, Any]] = []
    a, b = args.versions
    for _ in range(args.rounds):
        for code in codes:   # alternating within a round: a busy moment falls on every checkout
            for version in (b, a):
                rows[str(code)].append(rollback_once(code, args, version))
        wall, cpu, _result = timed([sys.executable, "-c", FLOOR], {**os.environ, "PYTHONPATH": str(REPO)})
        floor.append({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)})
    result = {
        "what": f"relctl rollback {args.model} --to A|B" + (" --server URL" if args.server else ""),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "rounds": args.rounds,
        "import_floor": {"command": f"python -c '{FLOOR}'", **medians(floor)},
        "median": {str(code): medians(r) for code, r in rows.items()},
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"import_floor": result["import_floor"], "median": result["median"]}, indent=2))


if __name__ == "__main__":
    main()
