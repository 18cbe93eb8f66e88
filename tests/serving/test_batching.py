"""Batched serving through onnxruntime-genai's Engine: same answers as the thread-pool path, batch size
visible in /health, /v1/models and /metrics, and requests really share model steps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from release.core.package import read_manifest
from release.core.server_settings import ServerSettings
from release.serving.engine import Engine, Finished, open_engine
from release.serving.process import ServerProcess
from release.serving.protocol import GenerationParams
from tests.serving.conftest import write_server_config

PROMPTS = ["the quick brown fox", "alpha beta gamma", "one two three and", "a tiny model serves"]


def params(**overrides: object) -> GenerationParams:
    base: dict[str, object] = {"max_tokens": 24, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None,
                               "stop": (), "ignore_eos": True}
    return GenerationParams(**{**base, **overrides})  # type: ignore[arg-type]


def run_all(engine: Engine, jobs: list[tuple[str, GenerationParams]], together: bool = False
            ) -> list[tuple[str, Finished]]:
    """Every job at once. `together`: all of them are in the batching engine's inbox before its driver
    forms the next batch (the loop submits them one by one, and the driver may start a batch between two)."""
    async def one(prompt: str, p: GenerationParams) -> tuple[str, Finished]:
        pieces: list[str] = []
        async for event in engine.generate(engine.encode(prompt), p, time.monotonic() + 60, "test"):
            if isinstance(event, Finished):
                return "".join(pieces), event
            pieces.append(event)
        raise AssertionError("no Finished event")

    async def every() -> list[tuple[str, Finished]]:
        if not together or engine.batch is None:
            return list(await asyncio.gather(*[one(prompt, p) for prompt, p in jobs]))
        # The driver takes its inbox under this (reentrant) lock, so holding it on the loop thread while
        # the tasks submit makes them arrive together.
        with engine.batch._wake:
            tasks = [asyncio.ensure_future(one(prompt, p)) for prompt, p in jobs]
            while len(engine.batch._inbox) < len(jobs):
                await asyncio.sleep(0)
        return list(await asyncio.gather(*tasks))

    return asyncio.run(every())


@pytest.fixture(scope="module")
def engines(tiny_package: Path) -> Iterator[tuple[Engine, Engine]]:
    batched = open_engine(read_manifest(tiny_package), ServerSettings(batching="on", max_batch_size=8))
    threads = open_engine(read_manifest(tiny_package), ServerSettings(batching="off", workers=2))
    yield batched, threads
    batched.close()
    threads.close()


def test_batched_greedy_answers_match_the_thread_pool(engines: tuple[Engine, Engine]) -> None:
    batched, threads = engines
    assert batched.batching["mode"] == "engine" and threads.batching["mode"] == "threads"
    jobs = [(p, params()) for p in PROMPTS] + [(PROMPTS[0], params(max_tokens=40, ignore_eos=False))]
    # The engine's counters are cumulative and the module's engines are shared by tests that run in a
    # random order, so this test's own steps are the difference.
    stats = batched.batch.stats  # type: ignore[union-attr]
    steps, tokens = stats.steps, stats.batched_tokens
    together = run_all(batched, jobs, together=True)
    own_steps, own_tokens = stats.steps - steps, stats.batched_tokens - tokens
    alone = run_all(threads, jobs)
    assert [text for text, _ in together] == [text for text, _ in alone]
    assert [(f.reason, f.output_tokens) for _, f in together] == [(f.reason, f.output_tokens) for _, f in alone]
    assert all(f.output_tokens == 24 and f.reason == "length" for _, f in together[:4])
    # All five were waiting: they ran in batches of the engine's width, in arrival order, each batch as
    # long as its longest request (one at a time would take 136 steps).
    width = batched.batching["max_batch_size"]
    assert 1 < width <= 8 and batched.batching["widest_step"] == width
    assert own_tokens == 4 * 24 + together[4][1].output_tokens
    assert own_steps == sum(max(f.output_tokens for _, f in together[i:i + width])
                            for i in range(0, len(together), width)), (own_steps, own_tokens, width)


def test_the_batch_never_exceeds_its_configured_size(tiny_package: Path) -> None:
    engine = open_engine(read_manifest(tiny_package), ServerSettings(batching="on", max_batch_size=2))
    try:
        assert engine.batching["max_batch_size"] == 2
        jobs = [(p, params()) for p in PROMPTS] + [(PROMPTS[0], params(max_tokens=8))]
        finished = run_all(engine, jobs, together=True)
        assert [f.output_tokens for _, f in finished] == [24, 24, 24, 24, 8]
        # Five waiting, two per step: batches (24, 24), (24, 24), (8).
        assert engine.batching["widest_step"] == 2 and engine.batching["steps"] == 24 + 24 + 8
    finally:
        engine.close()


def test_stop_strings_sampling_and_seeds_on_the_batched_path(engines: tuple[Engine, Engine]) -> None:
    batched, threads = engines
    (full, _), = run_all(batched, [(PROMPTS[1], params(max_tokens=30))])
    stop = full[3:5]
    (cut, finished), = run_all(batched, [(PROMPTS[1], params(max_tokens=30, stop=(stop,)))])
    assert finished.reason == "stop" and cut == full[: full.index(stop)]
    sampled = run_all(batched, [(PROMPTS[2], params(temperature=0.9, top_k=40, top_p=0.9))] * 3)
    assert all(f.reason == "length" and f.output_tokens == 24 for _, f in sampled)
    # A seed needs the per-request generator (the Engine's static scheduler has no per-turn seed): same
    # seed, same text, on either server.
    seeded = params(temperature=1.0, top_k=50, seed=7)
    (a, _), (b, _) = run_all(batched, [(PROMPTS[3], seeded), (PROMPTS[3], seeded)])
    (c, _), = run_all(threads, [(PROMPTS[3], seeded)])
    assert a == b == c
    assert batched.batching["resident"] == 0 and batched.in_flight == 0


def test_cancelled_and_timed_out_requests_leave_the_batch(engines: tuple[Engine, Engine]) -> None:
    batched, _ = engines

    async def scenario() -> tuple[Finished, int]:
        deadline = time.monotonic() + 0.3
        late = batched.generate(batched.encode("alpha"), params(max_tokens=1500), deadline, "late")
        gone = batched.generate(batched.encode("beta"), params(max_tokens=1500), time.monotonic() + 60, "gone")
        assert isinstance(await anext(gone), str)
        await gone.aclose()  # the client left
        events = [event async for event in late]
        last = events[-1]
        assert isinstance(last, Finished)
        for _ in range(200):
            if batched.batching["resident"] == 0:
                break
            await asyncio.sleep(0.02)
        return last, batched.batching["resident"]

    finished, resident = asyncio.run(scenario())
    assert finished.reason == "timeout"
    assert resident == 0


def test_server_reports_its_batch_size(tiny_package: Path, tmp_path: Path) -> None:
    config = write_server_config(tmp_path / "release.yaml", batching="on", max_batch_size=8, queue_size=8)
    with ServerProcess(str(tiny_package), tmp_path / "srv", config=config) as proc:
        health = httpx.get(f"{proc.url}/health").json()
        # What the server reports is what the engine runs: at most 8, and no wider than a measured step.
        width = health["batching"]["max_batch_size"]
        assert health["batching"]["mode"] == "engine" and 1 < width <= 8
        assert httpx.get(f"{proc.url}/v1/models").json()["data"][0]["max_batch_size"] == width

        async def crowd() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"prompt": "the quick brown fox", "max_tokens": 32, "ignore_eos": True}
                return list(await asyncio.gather(*[client.post(f"{proc.url}/v1/completions", json=body)
                                                   for _ in range(6)]))

        responses = asyncio.run(crowd())
        assert [r.status_code for r in responses] == [200] * 6
        assert all(r.json()["usage"]["completion_tokens"] == 32 for r in responses)
        metrics = httpx.get(f"{proc.url}/metrics").text
        assert f"relctl_max_batch_size {float(width)}" in metrics
        assert 1 < httpx.get(f"{proc.url}/health").json()["batching"]["widest_step"] <= width
        mean = float(next(line.split()[1] for line in metrics.splitlines()
                          if line.startswith("relctl_batch_mean_size ")))
        assert mean > 1.5, metrics


def test_a_top_p_below_float32_range_keeps_the_top_token(engines: tuple[Engine, Engine]) -> None:
    # Found by the schemathesis fuzz: top_p=5e-324 is positive, but 0 in the Engine's float32 (a 500).
    batched, threads = engines
    tiny = params(temperature=1.0, top_p=5e-324)
    (text, finished), = run_all(batched, [(PROMPTS[0], tiny)])
    (greedy, _), = run_all(threads, [(PROMPTS[0], params())])
    assert finished.reason == "length" and text == greedy


@pytest.mark.parametrize("temperature", [0.0, 1e-46, 1e-30, 0.7, 2.0])
def test_every_sampling_edge_is_served_on_both_paths(engines: tuple[Engine, Engine], temperature: float) -> None:
    # Found by the schemathesis fuzz: {"temperature": 0.7, "top_k": 1} was a 500 on the batched path (the
    # Engine refuses a temperature when top_k selects the top token); and the thread pool sampled when top_p
    # was 0 in float32 but top_k was set. Every valid corner (the server refuses top_k above the vocabulary).
    batched, threads = engines
    corners = [params(temperature=temperature, top_k=top_k, top_p=top_p)
               for top_k in (0, 1, 2, batched.limits.vocab_size) for top_p in (5e-324, 1e-45, 0.5, 1.0)]
    for engine in (batched, threads):
        finished = run_all(engine, [(PROMPTS[0], p) for p in corners])
        assert [(f.reason, f.output_tokens, f.error) for _, f in finished] == [("length", 24, None)] * len(corners)
    # Whatever can only pick the top token picks it: the greedy text on either path.
    (greedy, _), = run_all(threads, [(PROMPTS[0], params())])
    top_only = [p for p in corners if p.top_k == 1 or p.top_p == 5e-324 or temperature < 1e-45]
    for engine in (batched, threads):
        assert all(text == greedy for text, _ in run_all(engine, [(PROMPTS[0], p) for p in top_only]))
