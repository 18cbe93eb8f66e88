"""`relctl bench URL` with its defaults fits its prompts into the context that /v1/models reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from release.serving.loadgen.cli import bench_command
from release.serving.loadgen.dataset import synthetic_dataset
from release.serving.process import ServerProcess
from tests.serving.tinymodel import build_tiny_package

CONTEXT = 128  # the example model's context (examples/tiny-llm: max_position_embeddings)


@pytest.fixture(scope="module")
def short_context_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`relctl serve`, default settings, on a tiny package whose model has a 128-token context."""
    root = tmp_path_factory.mktemp("ctx128")
    package = build_tiny_package(root, hidden=64, layers=2, context=CONTEXT)
    with ServerProcess(str(package), root / "work") as proc:
        yield proc


def test_bench_defaults_get_no_errors_from_relctl_serve(short_context_server: ServerProcess, tmp_path: Path) -> None:
    url = short_context_server.url
    # The synthetic prompts as they were before sizing: the server refuses the long ones.
    unsized = max(synthetic_dataset(64, 0, output_tokens=32), key=lambda s: len(s.prompt))
    refused = httpx.post(f"{url}/v1/completions", json={"prompt": unsized.prompt, "max_tokens": 32}, timeout=30)
    assert refused.status_code == 400 and "context" in refused.text

    # Defaults for everything that shapes the requests (only their count and rate are cut for time).
    result = CliRunner().invoke(bench_command, [url, "--requests", "30", "--rate", "10", "--out", str(tmp_path),
                                                "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["max_model_len"] == CONTEXT
    summary = report["runs"][0]["summary"]
    assert summary["errors"] == {} and summary["completed"] == 30
    records = [json.loads(line) for line in Path(report["runs"][0]["records"]).read_text().splitlines()]
    assert all(r["output_tokens"] == 32 for r in records)  # --output-tokens 32, as --help says
    assert max(r["prompt_tokens"] for r in records) + 32 <= CONTEXT
    assert len({r["prompt_tokens"] for r in records}) > 3  # still a spread of prompt lengths


def test_a_dataset_row_that_cannot_fit_is_refused_before_sending(short_context_server: ServerProcess,
                                                                  tmp_path: Path) -> None:
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(json.dumps({"prompt": "short", "output_tokens": 8}) + "\n"
                       + json.dumps({"prompt": "the answer " * 10, "output_tokens": 200}) + "\n")
    result = CliRunner().invoke(bench_command, [short_context_server.url, "--dataset", str(dataset), "--requests", "5",
                                                "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert (f"error: data.jsonl: line 2: prompt (at least 14 tokens) + output (200) exceeds the endpoint's context "
            f"of {CONTEXT} tokens") in result.output
    assert "hint: " in result.output
    assert not (tmp_path / "out").exists()  # nothing half-written
