"""Graceful shutdown, the request log's retention policy, and serving a version by alias from MLflow."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from release.core.errors import InputError
from release.core.hashing import sha256_file
from release.core.server_settings import RequestLogPolicy
from release.registry import tags as T
from release.serving.process import ServerProcess
from release.serving.requestlog import RequestLog, redact
from release.serving.source import parse_spec, resolve_package
from tests.serving.conftest import write_server_config
from tests.serving.tinymodel import build_tiny_package


@pytest.fixture(scope="module")
def slow_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model big enough (~5 ms a token here) that a 400-token stream outlasts four clients connecting."""
    return build_tiny_package(tmp_path_factory.mktemp("slow-serving"), hidden=512, layers=8, context=512)


def test_sigterm_finishes_every_in_flight_stream(slow_package: Path, tmp_path: Path) -> None:
    # A generous grace: on a loaded shared machine four 400-token streams on one worker can outlast 30 s.
    config = write_server_config(tmp_path / "release.yaml", workers=1, queue_size=8, max_output_tokens=400,
                                 shutdown_grace_s=120)
    results: dict[int, list[str]] = {}
    first_chunk = threading.Event()

    def stream(i: int, url: str) -> None:
        body = {"prompt": "alpha beta", "max_tokens": 400, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        lines: list[str] = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    first_chunk.set()
        results[i] = lines

    proc = ServerProcess(str(slow_package), tmp_path / "srv", config=config).start()
    try:
        threads = [threading.Thread(target=stream, args=(i, proc.url)) for i in range(4)]
        for t in threads:
            t.start()
        assert first_chunk.wait(60)
        deadline = time.monotonic() + 30
        while httpx.get(f"{proc.url}/health").json()["in_flight"] < 4:
            assert time.monotonic() < deadline, "the four streams were never admitted together"
            time.sleep(0.01)
        # One worker: three streams are still queued or generating when the signal arrives.
        code = proc.stop(timeout_s=120)
        for t in threads:
            t.join(120)
    finally:
        proc.stop()
    log = (tmp_path / "srv" / "server.log").read_text()
    assert code == 0, log
    assert sorted(results) == [0, 1, 2, 3], log
    for lines in results.values():
        assert lines[-1] == "[DONE]"
        assert json.loads(lines[-2])["usage"]["completion_tokens"] == 400
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{proc.url}/health", timeout=2)
    assert "relctl serve: stopped by SIGTERM; every in-flight request finished" in log, log


def test_request_log_redacts_and_is_off_by_default(tiny_package: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    config = write_server_config(tmp_path / "release.yaml",
                                 request_log={"enabled": True, "content": "redact", "directory": str(logs)})
    with ServerProcess(str(tiny_package), tmp_path / "srv", config=config) as proc:
        prompt = "mail jane.doe@example.com, call +1 555 010 9999, key sk-live_abcdefghijklmnopqrstu"
        assert httpx.post(f"{proc.url}/v1/completions", json={"prompt": prompt, "max_tokens": 3, "ignore_eos": True},
                          timeout=30).status_code == 200
    (day,) = logs.glob("requests-*.jsonl")
    line = json.loads(day.read_text().splitlines()[0])
    assert line["prompt"] == "mail [EMAIL], call [NUMBER], key [KEY]"
    assert line["model"] == "tiny-llm:unregistered" and line["output_tokens"] == 3
    # Off by default: a server without the policy writes nothing.
    with ServerProcess(str(tiny_package), tmp_path / "srv2", project_dir=tmp_path / "p2") as proc:
        httpx.post(f"{proc.url}/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=30)
    assert not list((tmp_path / "p2").rglob("requests-*.jsonl"))


def test_spec_forms_are_parsed_or_refused_with_the_accepted_forms() -> None:
    assert parse_spec("m@production").alias == "production"
    assert parse_spec("team/m/12").version == "12" and parse_spec("team/m/12").model == "team/m"
    assert parse_spec("models:/m/3").version == "3" and parse_spec("models:/m@prod").alias == "prod"
    for bad in ("m", "m/", "m/v1", "m/0", "models:/m", "@prod", "models:/m/x"):
        with pytest.raises(InputError) as info:
            parse_spec(bad)
        assert "MODEL" in (info.value.hint or "") + info.value.message


def test_retention_deletes_old_days_and_hash_mode_keeps_no_text(tmp_path: Path) -> None:
    log = RequestLog(RequestLogPolicy(enabled=True, content="hash", retention_days=3), tmp_path)
    tmp_path.mkdir(exist_ok=True)
    for day in ("2026-01-01", "2026-01-07", "2026-01-08"):
        (tmp_path / f"requests-{day}.jsonl").write_text("{}\n")
    log.write({"id": "a"}, "secret prompt", "out", now=dt.datetime(2026, 1, 10, tzinfo=dt.UTC))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "requests-2026-01-08.jsonl", "requests-2026-01-10.jsonl"]
    line = json.loads((tmp_path / "requests-2026-01-10.jsonl").read_text())
    assert line["prompt"].startswith("sha256:") and "secret" not in json.dumps(line)
    assert redact("order 12345 from a@b.io") == "order [NUMBER] from [EMAIL]"


def test_serves_a_version_by_alias_and_refuses_a_tampered_package(tiny_package: Path, tmp_path: Path) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    from release.registry.store import connect, ensure_experiment, resolve_store

    project = tmp_path / "project"
    project.mkdir()
    # About resolving and the registry digest, not signatures (tests/signing): an unsigned package, said so.
    (project / "release.yaml").write_text("signing: off\n")
    store = resolve_store(project, environ={})
    connect(store)
    client = MlflowClient(tracking_uri=store.tracking_uri, registry_uri=store.tracking_uri)
    experiment = ensure_experiment(store, "tiny-llm")
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_artifacts(str(tiny_package), artifact_path="package")
        uri = mlflow.get_artifact_uri("package")
    client.create_registered_model("tiny-llm")
    version = client.create_model_version("tiny-llm", source=uri, run_id=run.info.run_id)
    client.set_model_version_tag("tiny-llm", version.version, T.PACKAGE_URI, uri)
    client.set_model_version_tag("tiny-llm", version.version, T.MANIFEST_SHA256,
                                 sha256_file(tiny_package / "relctl-package.json"))
    client.set_registered_model_alias("tiny-llm", "production", version.version)

    served = resolve_package("tiny-llm@production", project, environ={})
    assert served.identity.model_id == f"tiny-llm:{version.version}"
    # A pinned version, in relctl's and in MLflow's URI form, is the same package.
    for spec in (f"tiny-llm/{version.version}", f"models:/tiny-llm/{version.version}", "models:/tiny-llm@production"):
        again = resolve_package(spec, project, environ={})
        assert again.identity == served.identity and again.manifest.root == served.manifest.root
    # The cache is never trusted on its own: a changed cached file is fetched again from the registry.
    cached = served.manifest.model_dir / "genai_config.json"
    cached.write_text(cached.read_text() + " ")
    refetched = resolve_package(f"tiny-llm/{version.version}", project, environ={})
    assert (refetched.manifest.model_dir / "genai_config.json").read_bytes() == (
        tiny_package / "model" / "genai_config.json").read_bytes()
    assert served.identity.serving_config == json.loads((tiny_package / "relctl-package.json").read_text())[
        "serving_config_hash"]
    with ServerProcess("tiny-llm@production", tmp_path / "srv", project_dir=project) as proc:
        resp = httpx.post(f"{proc.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert resp.json()["model"] == f"tiny-llm:{version.version}"
        assert resp.headers["x-relctl-version"] == str(version.version)

    with pytest.raises(InputError, match="no such model or alias"):
        resolve_package("tiny-llm@staging", project, environ={})
    with pytest.raises(InputError, match="not found"):
        resolve_package("tiny-llm/99", project, environ={})
    tampered = tmp_path / "tampered"
    shutil.copytree(tiny_package, tampered)
    with (tampered / "model" / "genai_config.json").open("a") as fh:
        fh.write(" ")
    with pytest.raises(InputError, match="does not match its sha256"):
        resolve_package(str(tampered), project)
