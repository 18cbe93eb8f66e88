"""schemathesis against the server's own /openapi.json: bounded examples per operation, every response
within a per-request timeout, no 5xx, and a normal request still served after the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from release.serving.process import ServerProcess
from tests.serving.conftest import write_server_config

REQUEST_TIMEOUT_S = 10.0  # a hang shows as a requests timeout, failing the example
EXAMPLES = 25  # per operation and generation mode: 50 per operation in all


@pytest.fixture(scope="module")
def fuzzed(tiny_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("fuzz")
    # Small output and prompt limits keep each example cheap; the schema advertises exactly these.
    config = write_server_config(work / "release.yaml", workers=2, queue_size=16, max_prompt_tokens=64,
                                 max_output_tokens=8, default_max_tokens=4, request_timeout_s=8)
    with ServerProcess(str(tiny_package), work, config=config) as proc:
        yield proc


# schemathesis.pytest.from_fixture (the lazy loader) breaks on pytest 9 (it reads Function._nodeid), so the
# served schema is loaded in the test and each operation's strategy is driven with hypothesis directly.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_no_server_error_and_no_hang(fuzzed: ServerProcess, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json", timeout=10)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}
    seen: dict[str, int] = {}

    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # nothing to get wrong: the GET operations take no input
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=True, database=None)
        def check(case: Any) -> None:
            response = case.call(base_url=fuzzed.url, timeout=REQUEST_TIMEOUT_S)
            label = f"{case.method} {case.path}"
            seen[label] = seen.get(label, 0) + 1
            if response.status_code == 200:
                seen["ok"] = seen.get("ok", 0) + 1
            assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:300]}"
            assert "x-relctl-serving-config" in response.headers
            if 400 <= response.status_code < 500:
                error = response.json()["error"]
                assert error["code"] == response.status_code and error["message"], response.text

        check()
    assert seen.get("POST /v1/completions", 0) >= 10 and seen.get("POST /v1/chat/completions", 0) >= 10, seen
    if mode is GenerationMode.POSITIVE:
        assert seen.get("ok", 0) >= 10, seen  # valid requests were generated and answered, not only refused


def test_served_after_the_fuzz_and_no_error_counted(fuzzed: ServerProcess) -> None:
    # Module order: the fuzz above ran first against the same server.
    ok = httpx.post(f"{fuzzed.url}/v1/completions", json={"prompt": "the quick brown", "max_tokens": 4}, timeout=30)
    assert ok.status_code == 200, ok.text
    assert httpx.get(f"{fuzzed.url}/health").json()["in_flight"] == 0
    metrics = httpx.get(f"{fuzzed.url}/metrics").text
    assert "relctl_errors_total" not in metrics or all(
        line.endswith(" 0.0") for line in metrics.splitlines() if line.startswith("relctl_errors_total"))
    assert 'code="500"' not in metrics
