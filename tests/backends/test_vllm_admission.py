"""An engine that schedules itself is measured as the engine, not as relctl's queue (issue 27, step 4).

vLLM batches continuously up to its max_num_seqs; relctl's server in front used to admit
`serving.server.workers` (2) requests at once and refuse the rest with 429, so the engines table ranked
relctl's queue. The same seeded plan is sent to vLLM alone (its own OpenAI server), to `relctl serve`
fronting the same package's vLLM with release.yaml's defaults, and to relctl's router in front of that
server; relctl must reach at least 0.9x the requests/s vLLM reaches alone, without a refusal.

A random Llama at head_dim 64 (vLLM's CPU attention takes 64 or 128): the engine's work, not the
answers, is measured. One vLLM runs at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from release.backends.vllm import VllmBackend
from release.backends.vllm.engine import EngineProcess, free_port, log_path
from release.core.package import build_package
from release.core.server_settings import ServerSettings
from release.serving.engine import admitted_settings
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.runner import RunResult, Traffic, plan_traffic, run_one
from release.serving.loadgen.summary import SLOs
from release.serving.process import ServerProcess
from release.serving.router import Router
from release.serving.router.server import RouterServer
from tests.serving.tinymodel import build_hf_model

pytestmark = pytest.mark.slow

CONTEXT = 256
# More requests than relctl's old default admitted (2 workers + 16 queued), fewer than vLLM schedules at once
# (128), sent faster than the engine finishes them: the engine's own capacity decides the rate.
PLAN = Traffic(arrival="poisson", rate=100, requests=120, output_tokens=16, seed=7, warmup=2)
RATIO = 0.9


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vllm-admission")
    checkpoint = build_hf_model(root / "hf", hidden=512, layers=4, context=CONTEXT)  # 4 heads: head_dim 128
    backend = VllmBackend()
    backend.export(checkpoint, root / "model", "fp32", "cpu", root / "export.log")
    fields = {"model_name": "capacity", "precision": "fp32", "lineage": {}, "serving": {}}  # defaults: workers 2
    build_package(root / "package", root / "model", checkpoint, fields, backend)
    return root / "package"


def saturate(url: str, model: str | None) -> RunResult:
    offsets, samples = plan_traffic(PLAN, max_model_len=CONTEXT)
    return run_one(url, ClientOptions(url, model, timeout_s=120), offsets, samples, SLOs(), PLAN.rate, PLAN.warmup)


@pytest.fixture(scope="module")
def measured(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    backend, model_dir, port = VllmBackend(), package / "model", free_port()
    command = backend.server_command(model_dir, "engine", "127.0.0.1", port, ServerSettings())
    engine = EngineProcess(command, f"http://127.0.0.1:{port}", log_path("admission-alone", port)).start()
    try:
        alone = saturate(engine.url, "engine")
    finally:
        engine.stop()
    work = tmp_path_factory.mktemp("relctl-serve")
    with ServerProcess(str(package), work) as server:
        behind = saturate(server.url, None)
        with RouterServer(Router(server.url, server.url)) as router:
            routed = saturate(router.url, None)
    results = {name: run.summary for name, run in (("alone", alone), ("relctl", behind), ("router", routed))}
    print({name: (round(s["request_throughput"], 2), s["errors"]) for name, s in results.items()})
    yield results


def test_vllms_admission_limit_is_the_width_it_is_started_with(tmp_path: Path) -> None:
    backend = VllmBackend()
    settings = ServerSettings()
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 256}')
    argv = backend.server_command(tmp_path, "m", "127.0.0.1", 1, settings).argv
    started_with = int(argv[argv.index("--max-num-seqs") + 1])
    assert backend.admission_limit(settings) == started_with
    assert admitted_settings(backend, settings).workers == started_with
    assert admitted_settings(backend, ServerSettings(workers=64)).workers == started_with  # never below the engine
    assert admitted_settings(backend, ServerSettings(workers=64)).queue_size == settings.queue_size


def test_relctl_serve_in_front_of_vllm_reaches_what_vllm_reaches_alone(measured: dict[str, dict[str, Any]]) -> None:
    alone, behind = measured["alone"], measured["relctl"]
    # A random model's answer may decode to no text ("empty"): the same requests on every path. A 429 is
    # relctl refusing what the engine would have run.
    assert alone["requests"] == PLAN.requests and set(alone["errors"]) <= {"empty"}, alone["errors"]
    assert behind["errors"] == alone["errors"], f"relctl refused what vLLM would run: {behind['errors']}"
    assert behind["request_throughput"] >= RATIO * alone["request_throughput"], measured


def test_relctls_router_in_front_keeps_the_engines_rate(measured: dict[str, dict[str, Any]]) -> None:
    routed, alone = measured["router"], measured["alone"]
    assert routed["errors"] == alone["errors"]
    assert routed["request_throughput"] >= RATIO * alone["request_throughput"], measured
