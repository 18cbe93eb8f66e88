"""One plan split into segments run by separate processes, merged back: the figures of a single run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from release.serving.loadgen.cli import bench_command, run_command
from release.serving.loadgen.segments import Segment, parse_segment

N, RATE, SEGMENTS = 400, 100.0, 4


def bench_args(url: str, out: Path) -> list[str]:
    return [f"{url}/d/20/2", "--rate", str(RATE), "--requests", str(N), "--output-tokens", "4", "--seed", "5",
            "--warmup", "1", "--out", str(out), "--json"]


def records(folder: Path) -> list[dict[str, object]]:
    path = next(folder.glob("records-*.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_four_segment_processes_merge_to_the_single_run(delay_server: str, tmp_path: Path) -> None:
    start_at = time.time() + 8  # every process imports and warms up before the shared start
    procs = [subprocess.Popen([sys.executable, "-m", "release.serving.loadgen",
                               *bench_args(delay_server, tmp_path / f"seg-{i}"), "--segment", f"{i}/{SEGMENTS}",
                               "--start-at", f"{start_at:.3f}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(SEGMENTS)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
    single = CliRunner().invoke(bench_command, bench_args(delay_server, tmp_path / "single"))
    assert single.exit_code == 0, single.output
    merged = CliRunner().invoke(bench_command, ["merge", *(str(tmp_path / f"seg-{i}") for i in range(SEGMENTS)),
                                                "--out", str(tmp_path / "merged"), "--json"])
    assert merged.exit_code == 0, merged.output
    one = json.loads(single.output)["runs"][0]["summary"]
    union = json.loads(merged.output)["runs"][0]["summary"]

    # The segments are the single plan, split: disjoint, complete, same send times.
    parts = [records(tmp_path / f"seg-{i}") for i in range(SEGMENTS)]
    plan = {r["index"]: r["scheduled_s"] for r in records(tmp_path / "single")}
    assert sorted(r["index"] for part in parts for r in part) == list(range(N))
    for i, part in enumerate(parts):
        assert {r["index"] % SEGMENTS for r in part} == {i}
        assert all(r["scheduled_s"] == plan[r["index"]] for r in part)
    assert union["requests"] == one["requests"] == N and union["completed"] == one["completed"] == N
    assert abs(union["achieved_rate"] - one["achieved_rate"]) / one["achieved_rate"] < 0.02
    assert abs(union["achieved_rate"] - RATE) / RATE < 0.02
    # Percentiles of the union of the records, not an average of per-segment percentiles.
    ttft = np.array([r["ttft_s"] for part in parts for r in part]) * 1000.0
    for p in (50, 90, 95, 99):
        assert union["ttft_ms"][f"p{p}"] == pytest.approx(float(np.percentile(ttft, p)), rel=1e-12)
    assert abs(union["ttft_ms"]["p50"] - one["ttft_ms"]["p50"]) < 3.0
    assert abs(union["tpot_ms"]["p50"] - one["tpot_ms"]["p50"]) < 2.0
    # A segment alone sends a quarter of the rate.
    seg0 = json.loads((tmp_path / "seg-0" / "summary.json").read_text())
    assert seg0["runs"][0]["summary"]["target_rate"] == RATE / SEGMENTS

    # Merging an incomplete set is refused: one line naming what is missing, exit 2.
    partial = CliRunner().invoke(bench_command, ["merge", *(str(tmp_path / f"seg-{i}") for i in range(3)),
                                                 "--out", str(tmp_path / "partial")])
    assert partial.exit_code == 2 and "error: bench merge: segments [0, 1, 2] of 4 given; missing [3]" in partial.output


def test_segment_and_start_time_inputs_are_checked(tmp_path: Path) -> None:
    assert parse_segment("3/4") == Segment(3, 4) and Segment(1, 3).indices(8) == [1, 4, 7]
    for bad in ("4/4", "1", "-1/2", "a/b"):
        result = CliRunner().invoke(bench_command, ["http://127.0.0.1:9", "--segment", bad, "--out", str(tmp_path)])
        assert result.exit_code == 2 and f"error: --segment {bad}: expected i/N" in result.output, result.output
    past = CliRunner().invoke(bench_command, ["http://127.0.0.1:9", "--segment", "0/2", "--start-at", "1000",
                                              "--out", str(tmp_path)])
    assert past.exit_code == 2 and "error: --start-at 1000.000: that time passed" in past.output


def test_render_job_is_an_indexed_job_whose_pods_run_the_segments(tmp_path: Path) -> None:
    args = ["http://vllm.default.svc:8000", "--rate", "800", "--requests", "20000", "--seed", "3", "--no-stream",
            "--slo", "ttft_p99_ms=500", "--slo", "max_error_rate=0.01"]
    result = CliRunner().invoke(bench_command, [*args, "--render-job", "-", "--segments", "4", "--start-at",
                                                "1900000000", "--image", "ghcr.io/acme/relctl:1.2"])
    assert result.exit_code == 0, result.output
    job = yaml.safe_load(result.output)
    spec = job["spec"]
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/acme/relctl:1.2" and container["command"] == ["relctl", "bench"]
    env = {e["name"]: e for e in container["env"]}
    assert "job-completion-index" in env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    # What pod 2 runs after Kubernetes expands $(JOB_COMPLETION_INDEX): the same options plus its segment.
    pod_args = [a.replace("$(JOB_COMPLETION_INDEX)", "2") for a in container["args"]]
    ctx = run_command.make_context("run", pod_args)
    assert ctx.params["segment"] == "2/4" and ctx.params["start_at"] == 1900000000.0
    assert ctx.params["rate"] == 800.0 and ctx.params["count"] == 20000 and ctx.params["stream"] is False
    assert ctx.params["slo_pairs"] == ("ttft_p99_ms=500", "max_error_rate=0.01")
    assert str(ctx.params["out_dir"]) == "/results/segment-2"
