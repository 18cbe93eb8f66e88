"""`relctl bench` end to end (CLI, compare, sweep) and the load gate on a real package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gates.base import GateContext
from gates.load import LoadConfig, LoadGate
from release.serving.loadgen.cli import bench_command


def write_dataset(path: Path) -> Path:
    rows = [{"prompt": "the quick brown fox " * (1 + i % 7), "output_tokens": 4 + (i * 5) % 29} for i in range(40)]
    rows.append({"messages": [{"role": "user", "content": "alpha beta gamma"}], "output_tokens": 12})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_bench_cli_runs_compares_and_writes_evidence(delay_server: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(bench_command, [
        f"{delay_server}/d/10/2", "--compare", f"{delay_server}/d/30/2", "--rate", "40",
        "--requests", "60", "--dataset", str(write_dataset(tmp_path / "data.jsonl")), "--out", str(out), "--json",
        "--slo", "ttft_p99_ms=1000", "--temperature", "0.7"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["kind"] == "compare" and len(report["runs"]) == 2
    assert report["client"]["temperature"] == 0.7
    fast, slow = (run["summary"] for run in report["runs"])
    assert fast["completed"] == slow["completed"] == 60
    assert fast["ttft_ms"]["p50"] + 15 < slow["ttft_ms"]["p50"]
    # Same planned traffic on both: identical output-token totals.
    assert fast["output_tokens"] == slow["output_tokens"]
    records = [json.loads(line) for line in Path(report["runs"][0]["records"]).read_text().splitlines()]
    assert len(records) == 60 and {r["status"] for r in records} == {"ok"}
    assert len({r["expected_output_tokens"] for r in records}) > 5  # lengths drawn from the dataset
    assert (out / "latency-cdf.png").stat().st_size > 10_000
    assert json.loads((out / "summary.json").read_text())["kind"] == "compare"


def test_bench_sweep_finds_the_capacity_knee(delay_server: str, tmp_path: Path) -> None:
    # Two slots and a 50 ms server: about 40 req/s of capacity, beyond which client queueing breaks TTFT.
    result = CliRunner().invoke(bench_command, [
        f"{delay_server}/d/50/1", "--sweep", "--rate", "8", "--step-duration", "1.5",
        "--max-concurrency", "2", "--output-tokens", "2", "--slo", "ttft_p99_ms=150", "--warmup", "0",
        "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rates = [(run["rate"], run["passed"]) for run in report["runs"]]
    assert any(ok for _, ok in rates) and not all(ok for _, ok in rates)
    assert 16 <= report["best_rate"] <= 45, rates
    assert (tmp_path / "latency-vs-rate.png").is_file()


def test_bench_cli_refuses_an_unknown_slo(delay_server: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(bench_command, [delay_server, "--slo", "ttft_p42_ms=5", "--out",
                                                str(tmp_path)])
    # One error line naming the bad key, one hint listing the known ones, exit 2 (bad input).
    assert result.exit_code == 2, result.output
    assert "error: --slo ttft_p42_ms" in result.output and "hint: known SLOs" in result.output


def gate_context(package: Path, work: Path) -> GateContext:
    return GateContext(model_name="tiny-llm", package_dir=package, work_dir=work, production=None)


def eval_prompts_as_dataset(tiny_data: Path, path: Path) -> Path:
    """The trained model's eval prompts, with output lengths spread over 2..8 tokens."""
    rows = [json.loads(line) for line in (tiny_data / "eval.jsonl").read_text().splitlines() if line.strip()]
    path.write_text("\n".join(json.dumps({"prompt": r["prompt"], "output_tokens": 2 + i % 7})
                              for i, r in enumerate(rows)))
    return path


@pytest.mark.slow
def test_load_gate_passes_lenient_slos_and_fails_an_impossible_one(trained_package: Path, tiny_data: Path,
                                                                   tmp_path: Path) -> None:
    dataset = eval_prompts_as_dataset(tiny_data, tmp_path / "data.jsonl")
    traffic = {"arrival": "poisson", "rate": 8, "requests": 40, "dataset": str(dataset), "seed": 3}
    cost = {"gpu_price_per_hour": 2.0, "serverless_price_per_million_tokens": 0.5,
            "serverless_price_per_request": 0.001}
    lenient = LoadConfig.model_validate({
        "traffic": traffic, "cost": cost,
        "slos": {"ttft_p95_ms": 5000, "ttft_p99_ms": 10000, "tpot_p99_ms": 1000, "e2el_p99_ms": 20000,
                 "max_error_rate": 0.0, "min_goodput_rps": 1.0}})
    result = LoadGate(lenient).run(gate_context(trained_package, tmp_path / "lenient"))
    assert result.status == "pass", result.reason
    assert result.metrics["error_rate"] == 0.0
    assert result.details["server"]["model"] == "tiny-llm:unregistered"
    tokens_per_s = result.metrics["output_token_throughput"]
    assert result.metrics["cost_per_million_tokens"] == pytest.approx(2.0 / (tokens_per_s * 3600) * 1e6)
    assert result.metrics["breakeven_utilization_vs_per_token"] == pytest.approx(
        result.metrics["cost_per_million_tokens"] / 0.5)
    names = {p.name for p in result.evidence}
    assert {"summary.json", "latency-cdf.png"} <= names and any(n.startswith("records-") for n in names)
    assert all(p.is_file() for p in result.evidence)
    records = [json.loads(line) for p in result.evidence if p.name.startswith("records-")
               for line in p.read_text().splitlines()]
    assert len(records) == 40 and all(r["output_tokens"] == r["expected_output_tokens"] for r in records)

    impossible = LoadConfig.model_validate({"traffic": traffic, "slos": {"ttft_p99_ms": 0.001},
                                            "cost": {**cost, "max_cost_per_million_tokens": 1e9}})
    failed = LoadGate(impossible).run(gate_context(trained_package, tmp_path / "impossible"))
    assert failed.status == "fail"
    assert "ttft_p99_ms" in failed.reason
    # No SLO-meeting rate: no cost is claimed, so the cost ceiling cannot pass either.
    assert "cost_per_million_tokens" not in failed.metrics
    assert [c.metric for c in failed.thresholds if not c.passed] == ["ttft_p99_ms", "cost_per_million_tokens"]


def test_load_gate_config_refuses_unknown_keys() -> None:
    with pytest.raises(ValueError, match="ttft_p99"):
        LoadConfig.model_validate({"slos": {"ttft_p99": 5}})


def test_bench_with_model_given_needs_no_models_listing(tmp_path: Path) -> None:
    # Nothing listens on port 9: with --model the run still goes ahead (and records connect errors).
    result = CliRunner().invoke(bench_command, ["http://127.0.0.1:9", "--model", "m", "--requests", "3", "--rate", "50",
                                                "--warmup", "0", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output  # blocked: the error rate SLO
    report = json.loads(result.output[:result.output.rindex("}") + 1])
    assert report["runs"][0]["summary"]["errors"] == {"connect": 3} and report["max_model_len"] is None
