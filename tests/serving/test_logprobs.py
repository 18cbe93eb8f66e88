"""`logprobs` and `echo` on /v1/completions: the numbers are the backend's own logits (its `load` path), for the
prompt and for the generated tokens; what a backend cannot give is refused with a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

from release.backends import backend_of
from release.backends.base import LoadedModel, LogprobSupport
from release.backends.logprobs import log_softmax
from release.core.package import read_manifest
from release.core.server_settings import ServerSettings
from release.serving.process import ServerProcess

PROMPT = "reverse b d a f ->"


@pytest.fixture(scope="module")
def served(trained_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ServerProcess(str(trained_package), tmp_path_factory.mktemp("logprobs-server")) as proc:
        yield proc.url


@pytest.fixture(scope="module")
def loaded(trained_package: Path) -> LoadedModel:
    manifest = read_manifest(trained_package)
    return backend_of(manifest).load(manifest.model_dir)


def complete(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"temperature": 0, **body}, timeout=60)


def test_echo_scores_the_prompt_and_the_answer_with_the_engines_logits(served: str, loaded: LoadedModel) -> None:
    response = complete(served, prompt=PROMPT, max_tokens=4, logprobs=3, echo=True)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    lp = choice["logprobs"]
    prompt_ids = loaded.encode(PROMPT)
    generated = loaded.generate_ids(prompt_ids, 4)
    ids = prompt_ids + generated
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # Every position, prompt and answer, equals the backend's teacher-forced logits (its load path).
    expected = log_softmax(loaded.logits(ids))
    want = [float(expected[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert np.max(np.abs(np.array(lp["token_logprobs"][1:]) - np.array(want))) < 1e-5
    # Greedy: each answer token is its position's most likely one, and top-k is sorted, 3 wide.
    for text, logprob, top in zip(lp["tokens"][len(prompt_ids):], lp["token_logprobs"][len(prompt_ids):],
                                  lp["top_logprobs"][len(prompt_ids):], strict=True):
        assert len(top) == 3 and max(top.values()) == pytest.approx(logprob) and top[text] == pytest.approx(logprob)
    assert choice["text"] == PROMPT + loaded.decode(generated)
    assert lp["text_offset"] == list(np.cumsum([0, *map(len, lp["tokens"][:-1])]))


def test_token_id_prompts_are_scored_as_given(served: str, loaded: LoadedModel) -> None:
    ids = loaded.encode(PROMPT + " f a d b")
    response = complete(served, prompt=[ids], max_tokens=1, logprobs=1, echo=True)
    assert response.status_code == 200, response.text
    lp = response.json()["choices"][0]["logprobs"]
    expected = log_softmax(loaded.logits(ids))
    # lm-eval's local-completions sums token_logprobs[ctxlen:-1]: the prompt's entries, then one generated token
    # (the trained model ends its answer here, so that token is EOS: listed all the same).
    assert len(lp["token_logprobs"]) == len(ids) + 1
    assert np.allclose(lp["token_logprobs"][1:len(ids)], [expected[i - 1, ids[i]] for i in range(1, len(ids))],
                       atol=1e-5, rtol=0)


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": PROMPT, "logprobs": 21}, "logprobs"),
    ({"prompt": PROMPT, "logprobs": True}, "logprobs"),
    ({"prompt": PROMPT, "logprobs": 1, "stream": True}, "logprobs"),
    ({"prompt": PROMPT, "echo": True, "stream": True}, "echo"),
    ({"prompt": [[1, 2, 10**6]], "logprobs": 1}, "prompt"),
    ({"prompt": [[1, 2], [3]], "logprobs": 1}, "prompt"),
])
def test_bad_scoring_requests_are_refused_naming_the_field(served: str, body: dict[str, Any], param: str) -> None:
    response = complete(served, max_tokens=1, **body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_chat_still_refuses_logprobs(served: str) -> None:
    response = httpx.post(f"{served}/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "hi"}], "logprobs": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"


def test_a_backend_without_prompt_logprobs_is_refused_by_name(trained_package: Path, tmp_path: Path) -> None:
    """The refusal comes from the backend's declaration (here one that scores generated tokens only)."""
    from release.backends.onnxruntime_genai.runner import GenaiRunner
    from release.core.server_settings import RequestLogPolicy
    from release.serving.app import ServerState, create_app
    from release.serving.engine import Engine
    from release.serving.metrics import Identity, ServerMetrics
    from release.serving.requestlog import RequestLog

    manifest = read_manifest(trained_package)
    settings = ServerSettings(batching="off", workers=1)
    runner = GenaiRunner(manifest.model_dir, settings)
    declared = LogprobSupport(generated=True, prompt=False, why_not="its server refuses echo")
    engine = Engine(runner, settings, 0.0, "generated-only", declared)
    identity = Identity("tiny-llm", "unregistered", manifest.serving_config_hash)
    metrics = ServerMetrics(identity, 0.0, lambda: engine.queue_depth, lambda: engine.in_flight)
    state = ServerState(engine, identity, metrics, RequestLog(RequestLogPolicy(), tmp_path))
    with TestClient(create_app(state)) as client:
        refused = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "logprobs": 1, "echo": True})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "echo" and "generated-only backend: its server refuses echo" in error["message"]
        answered = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "logprobs": 1})
        assert answered.status_code == 200 and len(answered.json()["choices"][0]["logprobs"]["tokens"]) >= 1


def test_sampled_answers_list_every_generated_token_and_the_final_eos(served: str, loaded: LoadedModel) -> None:
    """At temperature 1.5 the tiny model samples byte pieces and word pieces whose own text has another length
    than in context (issue 40: 46 of 60 answers lost tokens, EOS among them); every answer lists each generated
    token, and an answer that ended with EOS lists it last."""
    del loaded   # the same package as the server's: the fixture only keeps the module's server warm
    ended_by_eos = 0
    for seed in range(30):
        response = complete(served, prompt=PROMPT, max_tokens=24, logprobs=1, temperature=1.5, seed=seed)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        generated = response.json()["usage"]["completion_tokens"]
        by_eos = choice["finish_reason"] == "stop"   # no stop strings given: "stop" is EOS
        ended_by_eos += by_eos
        assert len(choice["logprobs"]["tokens"]) == generated + by_eos, (seed, choice)
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["logprobs"]["tokens"])
    assert ended_by_eos > 0   # the EOS case was exercised
