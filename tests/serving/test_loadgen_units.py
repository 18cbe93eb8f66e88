"""Arrival plans, dataset rows and metric definitions, checked on known inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from release.core.errors import InputError
from release.serving.engine import StopMatcher
from release.serving.loadgen.arrivals import load_trace, plan_arrivals, scale_trace
from release.serving.loadgen.client import ClientOptions, Record, request_body
from release.serving.loadgen.dataset import Sample, draw_samples, load_dataset
from release.serving.loadgen.runner import Traffic, plan_traffic
from release.serving.loadgen.summary import SLOs, check_slos, summarize


def test_plans_hit_the_rate_exactly_and_differ_in_shape() -> None:
    n, rate = 4001, 20.0
    constant = plan_arrivals("constant", rate, n, seed=1)
    poisson = plan_arrivals("poisson", rate, n, seed=1)
    bursty = plan_arrivals("gamma", rate, n, seed=1, burstiness=0.25)
    for plan in (constant, poisson, bursty):
        assert plan[0] == 0.0 and np.all(np.diff(plan) >= 0)
        assert (n - 1) / plan[-1] == pytest.approx(rate, rel=1e-9)

    def cv(plan: np.ndarray) -> float:
        gaps = np.diff(plan)
        return float(gaps.std() / gaps.mean())

    assert cv(constant) < 1e-9
    assert cv(poisson) == pytest.approx(1.0, abs=0.08)        # exponential gaps
    assert cv(bursty) == pytest.approx(2.0, abs=0.25)         # Gamma shape k: CV = 1/sqrt(k)
    assert np.array_equal(poisson, plan_arrivals("poisson", rate, n, seed=1))
    assert not np.array_equal(poisson, plan_arrivals("poisson", rate, n, seed=2))


def test_bad_arrival_inputs_name_the_problem() -> None:
    with pytest.raises(InputError, match="rate -1"):
        plan_arrivals("poisson", -1, 10, 0)
    with pytest.raises(InputError, match="burstiness 0"):
        plan_arrivals("gamma", 1, 10, 0, burstiness=0)


def test_trace_replay_keeps_its_shape_and_rescales(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    stamps = [100.0, 100.5, 100.6, 102.0]
    path.write_text("\n".join(json.dumps({"timestamp": t, "prompt": f"p{i}", "output_tokens": 3 + i})
                              for i, t in enumerate(stamps)))
    trace = load_trace(path)
    assert trace.offsets.tolist() == pytest.approx([0.0, 0.5, 0.6, 2.0])
    assert scale_trace(trace, 3.0).tolist() == pytest.approx([0.0, 0.25, 0.3, 1.0])
    offsets, samples = plan_traffic(Traffic(arrival="trace", trace=str(path), rate=None), base_dir=None)
    assert offsets.tolist() == pytest.approx([0.0, 0.5, 0.6, 2.0])
    assert [s.output_tokens for s in samples] == [3, 4, 5, 6]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n{"timestamp": 1}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl: line 1 has no numeric 'timestamp'"):
        load_trace(tmp_path / "bad.jsonl")


def test_dataset_rows_set_prompts_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "short", "output_tokens": 4}\n'
                    '{"messages": [{"role": "user", "content": "hi"}], "output_tokens": 40}\n'
                    '{"prompt": "default length"}\n')
    rows = load_dataset(path, default_output_tokens=16)
    assert [r.output_tokens for r in rows] == [4, 40, 16]
    assert rows[1].chat_body() == {"messages": [{"role": "user", "content": "hi"}]}
    drawn = draw_samples(rows, 3000, seed=0)
    counts = {n: sum(s.output_tokens == n for s in drawn) for n in (4, 40, 16)}
    assert all(900 < c < 1100 for c in counts.values())
    path.write_text('{"prompt": "x", "output_tokens": -2}\n')
    with pytest.raises(InputError, match="line 1: output_tokens must be a positive integer"):
        load_dataset(path, 16)


def test_metrics_follow_the_product_definitions() -> None:
    a = Record(0, scheduled_s=0.0, ttft_s=0.1, e2el_s=0.5, tpot_s=0.1, itl_s=[0.1] * 4, output_tokens=5, status="ok")
    b = Record(1, scheduled_s=1.0, ttft_s=0.3, e2el_s=0.3, output_tokens=1, status="ok")
    c = Record(2, scheduled_s=1.5, status="http_429", http_status=429)
    summary = summarize([a, b, c], 2.0, SLOs(request_ttft_ms=200))
    assert summary["duration_s"] == pytest.approx(1.5)          # last end: 1.0 + 0.3 < 1.5 (c at 1.5)
    assert summary["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert summary["tpot_ms"]["mean"] == pytest.approx(100.0)   # only requests with > 1 token
    assert summary["itl_ms"]["p99"] == pytest.approx(100.0)
    assert summary["errors"] == {"http_429": 1}
    assert summary["error_rate"] == pytest.approx(1 / 3)
    assert summary["goodput_rps"] == pytest.approx(1 / 1.5)     # only a meets TTFT <= 200 ms
    assert summary["output_token_throughput"] == pytest.approx(6 / 1.5)
    checks = {c.metric: c.passed for c in check_slos(summary, SLOs(ttft_p99_ms=250, max_error_rate=0.5))}
    assert checks == {"ttft_p99_ms": False, "error_rate": True}


def test_stop_matcher_never_streams_part_of_a_stop_string() -> None:
    matcher = StopMatcher(("END",))
    out = [matcher.feed(p) for p in ("abc", "E", "N", "x", "yE", "ND", "zzz")]
    assert out == [("abc", False), ("", False), ("", False), ("ENx", False), ("y", False), ("", True), ("zzz", False)]


def test_request_body_carries_the_temperature_and_synthetic_lengths_follow_output_tokens() -> None:
    opts = ClientOptions(base_url="http://127.0.0.1:1", model="m", temperature=0.7)
    body = request_body(Sample("hi", None, 5), opts)
    assert body["temperature"] == 0.7 and body["max_tokens"] == 5 and body["model"] == "m"
    _, samples = plan_traffic(Traffic(requests=200, output_tokens=32))
    assert {s.output_tokens for s in samples} == {32}  # what --help says: every synthetic request asks for 32
    _, sized = plan_traffic(Traffic(requests=200, output_tokens=32), max_model_len=128)
    assert max(len(s.prompt) for s in sized) <= 128 - 32 - 4 < max(len(s.prompt) for s in samples)


def test_a_stop_string_cuts_the_listed_tokens_where_the_text_ends() -> None:
    """Scored answers (issue 40): token starts come from decoding the tokens before them, so a byte piece of a
    character (alone: U+FFFD, one character too many) does not push later tokens out; only a stop string cuts."""
    from release.serving.protocol import listed_tokens

    def decode(ids: list[int]) -> str:   # a byte-level tokenizer's own decoding: one id per UTF-8 byte
        return bytes(ids).decode("utf-8", "replace")

    ids = list("né done".encode())   # 'é' is two byte tokens
    eos = {0}
    assert listed_tokens([*ids, 0], eos, "né done", "stop", decode) == len(ids) + 1   # EOS listed last
    assert listed_tokens(ids, eos, "né done", "length", decode) == len(ids)
    assert listed_tokens(ids, eos, "né", "stop", decode) == 3   # stop string " done": n, and é's two bytes
