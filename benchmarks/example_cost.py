"""Benchmark: the example's cost per million output tokens with `relctl serve` batched vs the thread pool.

The load gate prices output tokens at the rate it judged (GPU price/hour x GPUs / (tokens/s x 3600) x 1e6),
so a figure from an unsaturated server is the price of the offered load, not of the server. Here the gate
sweeps instead (`sweep: true`: doubling from the example's rate, then bisection) and the cost is taken at
the highest rate that meets the example's SLOs, once with `serving.server.batching: on` and once with
`batching: off` (the thread pool, `workers` generations at once), same package, plan and SLOs, in one run.

The package is the example's own: examples/tiny-llm/train.py trained here and promoted with no gates
(`relctl promote` builds merge -> convert (int4) -> validate -> package). The gate runs in this process
exactly as promote runs it (gates.load.LoadGate), so the figures are the gate's.

    python benchmarks/example_cost.py            # about 5 minutes on 2 cores
    python benchmarks/example_cost.py --step-duration 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gates.load import CostConfig, LoadConfig, LoadGate
from release.core.server_settings import ServerSettings
from release.gating.contract import GateContext
from release.serving.loadgen.runner import Traffic
from release.serving.loadgen.summary import SLOs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-llm"
RESULTS = Path(__file__).parent / "results" / "example_cost.json"
RELCTL = Path(sys.executable).parent / "relctl"


def example_package(project: Path) -> Path:
    """Train the example and promote it with no gates; return the package folder promote built."""
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING"}
    env.pop("MLFLOW_TRACKING_URI", None)
    train = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--project-dir", str(project)],
                           check=True, capture_output=True, text=True, env=env)
    run_id = train.stdout.strip().splitlines()[-1]
    import yaml

    config = yaml.safe_load((EXAMPLE / "release.yaml").read_text())
    config.pop("gates", None)  # the load gate runs below, twice
    (project / "release.yaml").write_text(yaml.safe_dump({**config, "model": "tiny-llm-cost"}))
    subprocess.run([str(RELCTL), "--project-dir", str(project), "promote", run_id, "-q"], check=True, env=env)
    packages = [p.parent for p in (project / ".relctl" / "work").rglob("relctl-package.json")
                if not any(part.endswith(".partial") for part in p.parts)]
    if len(packages) != 1:
        raise SystemExit(f"expected one package folder, found {packages}")
    return packages[0]


def example_load_block() -> dict[str, Any]:
    import yaml

    block: dict[str, Any] = yaml.safe_load((EXAMPLE / "release.yaml").read_text())["gates"]["load"]
    return block


def run_gate(package: Path, work: Path, block: dict[str, Any], batching: str, step_duration_s: float) -> dict[str, Any]:
    traffic = {**block["traffic"], "dataset": str(EXAMPLE / block["traffic"]["dataset"])}
    # Enough requests per sweep step for a p99 at the highest rates tried.
    traffic["requests"] = max(int(traffic.get("requests", 40)), 200)
    config = LoadConfig(traffic=Traffic(**traffic), slos=SLOs(**block["slos"]), cost=CostConfig(**block["cost"]),
                        sweep=True, step_duration_s=step_duration_s, compare_production=False,
                        server=ServerSettings(batching=batching))  # type: ignore[arg-type]
    result = LoadGate(config).run(GateContext(model_name="tiny-llm-cost", package_dir=package,
                                              work_dir=work / f"load-{batching}", production=None,
                                              config_dir=EXAMPLE))
    report = json.loads((work / f"load-{batching}" / "summary.json").read_text())
    steps = [{"rate": run["summary"]["target_rate"], "passed": run["passed"],
              "errors": run["summary"]["errors"],
              "output_tokens_per_s": round(run["summary"]["output_token_throughput"], 1),
              "missed": [c["metric"] for c in run["slo_checks"] if not c["passed"]]} for run in report["runs"]]
    return {"status": result.status, "reason": result.reason, "sweep": steps,
            "best_rate": result.details.get("sweep_best_rate"), "server": result.details.get("server"),
            "metrics": {k: v for k, v in result.metrics.items()
                        if k in ("output_token_throughput", "request_throughput", "ttft_p99_ms", "tpot_p99_ms",
                                 "e2el_p99_ms", "cost_per_million_tokens", "breakeven_utilization_vs_per_token")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-duration", type=float, default=5.0, help="seconds per sweep step")
    args = parser.parse_args()
    block = example_load_block()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "project").mkdir()
        package = example_package(work / "project")
        modes = {mode: run_gate(package, work, block, mode, args.step_duration) for mode in ("on", "off")}
    on = modes["on"]["metrics"].get("cost_per_million_tokens")
    off = modes["off"]["metrics"].get("cost_per_million_tokens")
    out = {"benchmark": "example cost per million output tokens at the highest SLO-meeting rate (load gate sweep)",
           "slos": block["slos"], "cost": block["cost"], "step_duration_s": args.step_duration,
           "batching_on": modes["on"], "batching_off": modes["off"],
           "cost_off_over_on": round(off / on, 2) if on and off else None,
           "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
