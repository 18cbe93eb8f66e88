"""The engines table's rows as a real load gate measures them: what limited each, its repeat noise, and the
tie rule built on that noise (issue 27, step 4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gates.base import GateResult
from gates.load import LoadConfig, LoadGate
from release.pipeline.engines import Comparison, EngineRow, _load, choose, limited_by, repeat_noise, tied
from release.pipeline.ranking import why_tied
from tests.serving.test_bench_and_gate import eval_prompts_as_dataset, gate_context

COST = {"gpu_price_per_hour": 2.0}


@pytest.fixture(scope="module")
def swept(trained_package: Path, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    """The real load gate, sweeping from 4 req/s to its first failing step, then its best step sent again."""
    work = tmp_path_factory.mktemp("engine-rows")
    dataset = eval_prompts_as_dataset(tiny_data, work / "data.jsonl")
    config = LoadConfig.model_validate({
        "traffic": {"arrival": "poisson", "rate": 4, "requests": 20, "dataset": str(dataset), "seed": 3},
        "slos": {"ttft_p95_ms": 150, "max_error_rate": 0.0}, "cost": COST, "sweep": True, "step_duration_s": 2,
        "repeat_best": True})
    result = LoadGate(config).run(gate_context(trained_package, work / "gate"))
    print({"best_rate": result.details.get("sweep_best_rate"), "repeat": result.details.get("repeat"),
           "limit": result.details.get("limit"), "noise": repeat_noise(result)})  # the figures, with -s
    return result


def row_of(result: GateResult, label: str) -> EngineRow:
    row = EngineRow(label, "fp32", quality_passed=True)
    _load(row, result)
    row.noise, row.limited_by = repeat_noise(result), limited_by(result, None)
    return row


def test_a_swept_row_says_what_limited_it_and_how_noisy_it_is(swept: GateResult) -> None:
    assert swept.status == "pass", swept.reason
    limit = swept.details["limit"]
    row = row_of(swept, "onnxruntime-genai")
    best = swept.details["sweep_best_rate"]
    failed_above = [s["rate"] for s in swept.details["sweep_steps"] if not s["passed"] and s["rate"] > best]
    if not failed_above:
        # A fast machine can meet the SLOs at every step of the search (4 → 512 req/s): nothing was reached,
        # and the row must say so rather than name a limit it never saw.
        assert limit["rate"] is None and row.limited_by is not None and row.limited_by.startswith("not reached")
    else:
        assert limit["rate"] == min(failed_above)
        # relctl schedules onnxruntime-genai itself (no admission_limit): its queue may be what stops it.
        kind = "queue" if limit["errors"].get("http_429") else "errors" if limit["errors"] else "SLO"
        assert row.limited_by is not None and row.limited_by.startswith(kind) and \
            f"at {limit['rate']:g} req/s" in row.limited_by
    first, again = swept.details["repeat"]["output_token_throughput"]
    assert swept.details["repeat"]["rate"] == swept.details["sweep_best_rate"] and first > 0 and again > 0
    assert row.noise == pytest.approx(abs(first - again) / min(first, again))


def test_the_same_engine_measured_twice_is_a_tie_and_the_first_listed_is_taken(swept: GateResult) -> None:
    """Two real rows of one engine: the judged step and its repeat. Whatever their order by cost, the table
    calls it a tie within the noise it measured, and takes the row listed first."""
    first = row_of(swept, "first")
    first_tps, again_tps = swept.details["repeat"]["output_token_throughput"]
    again = replace(first, engine="again", output_tokens_per_s=again_tps,
                    cost_per_million_tokens=COST["gpu_price_per_hour"] / (again_tps * 3600) * 1e6)
    assert first.cost_per_million_tokens == pytest.approx(COST["gpu_price_per_hour"] / (first_tps * 3600) * 1e6)
    assert tied(first, again) and tied(again, first)
    for listed in ([first, again], [again, first]):
        rows = [replace(r, rejected=None) for r in listed]
        comparison = Comparison("auto", rows, None)
        assert choose(comparison) is rows[0]
        assert rows[1].rejected is not None and rows[1].rejected.startswith(f"tie with {rows[0].label}")
        # The chosen line names the tie and why the measurement could not tell them apart (repeat noise, or
        # both reached the sweep's top rate on a fast machine).
        assert f"a tie with {rows[1].label}, {why_tied(rows[0], rows[1])}" in comparison.why[0]


def test_a_difference_beyond_the_measured_noise_is_a_ranking(swept: GateResult) -> None:
    cheap = row_of(swept, "cheap")
    band = 2 * (cheap.noise or 0.0)
    dear = replace(cheap, engine="dear", cost_per_million_tokens=(cheap.cost_per_million_tokens or 0) * (1.5 + band))
    comparison = Comparison("auto", [dear, cheap], None)
    assert not tied(dear, cheap)
    assert choose(comparison) is cheap and dear.rejected is not None and dear.rejected.startswith("dearer")


def test_without_a_repeat_there_is_no_noise_and_no_tie() -> None:
    a = EngineRow("a", "fp32", quality_passed=True, slo_met=True, cost_per_million_tokens=1.0)
    b = EngineRow("b", "fp32", quality_passed=True, slo_met=True, cost_per_million_tokens=1.001)
    assert repeat_noise(GateResult("load", "pass", "")) is None
    assert not tied(a, b)


@pytest.mark.parametrize(("limit", "memory", "expected"), [
    ({"rate": 32, "errors": {"http_429": 5}, "requests": 64, "failed": ["error_rate"]}, None,
     "queue: 5 of 64 requests refused (429) by relctl's server at 32 req/s"),
    ({"rate": 16, "errors": {}, "requests": 32, "failed": ["ttft_p95_ms"], "e2el_mean_ms": 2000.0,
      "checks": {"ttft_p95_ms": [2500.0, "<=", 2000]}}, {"max_concurrency": 20},
     "KV capacity: ~32 sequences in flight at 16 req/s, the memory plan holds 20"),
    ({"rate": 16, "errors": {"timeout": 2}, "requests": 32, "failed": ["error_rate"]}, None,
     "errors at 16 req/s: 2 timeout"),
    ({"rate": 8, "errors": {}, "requests": 16, "failed": ["ttft_p95_ms"], "e2el_mean_ms": 100.0,
      "checks": {"ttft_p95_ms": [2345.6, "<=", 2000]}}, {"max_concurrency": 20},
     "SLO at 8 req/s: ttft_p95_ms 2346 (needs <= 2000)"),
    ({"rate": None, "errors": {}, "failed": []}, None, "not reached: every step of the sweep met the SLOs"),
])
def test_each_limit_is_named(limit: dict[str, object], memory: dict[str, object] | None, expected: str) -> None:
    assert limited_by(GateResult("load", "pass", "", details={"limit": limit}), memory).startswith(expected)
