"""Trace formats for --trace: detected from the file, replayed with their times and lengths."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.core.errors import InputError
from release.core.server_settings import RequestLogPolicy
from release.serving.loadgen.cli import bench_command
from release.serving.loadgen.client import Record
from release.serving.loadgen.runner import Traffic, plan_traffic
from release.serving.loadgen.traces import load_trace
from release.serving.requestlog import RequestLog


def lengths(path: Path, max_model_len: int | None = None) -> tuple[list[float], list[tuple[int | None, int]]]:
    offsets, samples = plan_traffic(Traffic(arrival="trace", trace=str(path), rate=None), max_model_len=max_model_len)
    return [round(float(o), 6) for o in offsets], [(s.prompt_tokens, s.output_tokens) for s in samples]


def test_azure_csv(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:46.1805900,879,20\n")
    trace = load_trace(path)
    assert trace.format == "azure"
    offsets, rows = lengths(path)
    # Sorted by time; 7 fractional digits are kept to the microsecond.
    assert offsets == pytest.approx([0.0, 0.5, 4.814579], abs=1e-6)
    assert rows == [(879, 20), (374, 44), (396, 109)]


def test_mooncake_jsonl_timestamps_are_milliseconds(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]},
            {"timestamp": 1500, "input_length": 120, "output_length": 7, "hash_ids": [48]},
            {"timestamp": 2000, "input_length": 64, "output_length": 3, "hash_ids": []}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert load_trace(path).format == "mooncake"
    offsets, got = lengths(path)
    assert offsets == [0.0, 1.5, 2.0] and got == [(6955, 52), (120, 7), (64, 3)]
    _, samples = plan_traffic(Traffic(arrival="trace", trace=str(path), rate=None))
    assert len(samples[2].prompt.split()) == 64  # a prompt of that many common words
    # Rescaled to a rate, the shape stays: 2 gaps over 2 s at 1 req/s become 1 s at 2 req/s.
    offsets2, _ = plan_traffic(Traffic(arrival="trace", trace=str(path), rate=2.0))
    assert [float(o) for o in offsets2] == pytest.approx([0.0, 0.75, 1.0])
    with pytest.raises(InputError, match="row 1: prompt \\(6955 tokens\\) \\+ output \\(52\\) exceeds the endpoint's "
                                         "context of 4096 tokens"):
        lengths(path, max_model_len=4096)


def test_relctl_serve_request_log_with_hashed_content(tmp_path: Path) -> None:
    log = RequestLog(RequestLogPolicy(enabled=True, content="hash"), tmp_path / "logs")
    start = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    # Written when each request ends: arrivals are time - latency_s (0.0, 0.2, 1.0 s).
    for i, (arrived, latency, prompt_tokens, out) in enumerate([(0.0, 0.5, 11, 8), (0.2, 0.1, 40, 16),
                                                                (1.0, 0.3, 5, 2)]):
        record = {"id": f"r{i}", "endpoint": "completions", "model": "m:1", "serving_config": "abc", "status": 200,
                  "finish_reason": "length", "prompt_tokens": prompt_tokens, "output_tokens": out,
                  "latency_s": latency}
        log.write(record, f"secret prompt {i}", "output", now=start + dt.timedelta(seconds=arrived + latency))
    path = next((tmp_path / "logs").glob("requests-*.jsonl"))
    assert "secret" not in path.read_text()
    assert load_trace(path).format == "requestlog"
    offsets, rows = lengths(path)
    assert offsets == pytest.approx([0.0, 0.2, 1.0], abs=1e-5)
    assert rows == [(11, 8), (40, 16), (5, 2)]


def test_bench_and_router_records(tmp_path: Path) -> None:
    path = tmp_path / "records-router.jsonl"
    recs = [Record(i, scheduled_s=0.1 * i, prompt_tokens=10 + i, expected_output_tokens=4 + i, status="ok")
            for i in range(4)]
    # The router's records are loadgen records plus backend fields.
    lines = [json.dumps({**r.to_json(), "backend": "candidate" if r.index % 2 else "production",
                         "backend_url": "http://127.0.0.1:1"}) for r in recs]
    # A mirrored (shadow) copy of request 1 is not a second arrival.
    lines.append(json.dumps({**recs[1].to_json(), "index": 9, "backend": "candidate", "mirrored": True}))
    path.write_text("\n".join(lines))
    assert load_trace(path).format == "records"
    offsets, rows = lengths(path)
    assert offsets == pytest.approx([0.0, 0.1, 0.2, 0.3]) and rows == [(10, 4), (11, 5), (12, 6), (13, 7)]


def test_unknown_format_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "weird.csv"
    path.write_text("when,tokens\n1,2\n3,4\n")
    result = CliRunner().invoke(bench_command, ["http://127.0.0.1:9", "--trace", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].startswith("error: weird.csv: not a known trace format")
    assert lines[1].startswith("hint: known formats: relctl trace JSONL") and "Azure CSV" in lines[1]
    assert len(lines) == 2
    jsonl = tmp_path / "other.jsonl"
    jsonl.write_text('{"ts": 1, "len": 3}\n{"ts": 2, "len": 4}\n')
    with pytest.raises(InputError, match="line 1 has no numeric 'timestamp' and matches no known trace format"):
        load_trace(jsonl)
