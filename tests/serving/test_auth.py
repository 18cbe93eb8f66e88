"""`relctl serve --api-key` (Bearer, 401 with WWW-Authenticate, /health open) and --served-model-name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from release.serving.cli import serving_group
from release.serving.process import ServerProcess

KEY = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def guarded(tiny_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(str(tiny_package), tmp_path_factory.mktemp("auth"), api_key=KEY,
                       served_model_name="my-llm") as proc:
        yield proc


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_every_path_but_health_needs_the_key(guarded: ServerProcess) -> None:
    assert httpx.get(f"{guarded.url}/health").status_code == 200  # probes carry no credentials
    for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                         ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        for headers in ({}, auth("sk-wrong"), {"Authorization": KEY}, auth(KEY + "x")):
            resp = httpx.request(method, f"{guarded.url}{path}", headers=headers, json={"prompt": "hi"})
            assert resp.status_code == 401, (path, headers, resp.text)
            assert resp.headers["www-authenticate"].startswith("Bearer")
            assert resp.json()["error"]["code"] == 401
            assert resp.headers["x-relctl-model"] == "tiny-llm"
    metrics = httpx.get(f"{guarded.url}/metrics", headers=auth()).text
    assert 'relctl_rejected_total{reason="unauthorized"} 20.0' in metrics


def test_served_model_name_is_what_clients_see(guarded: ServerProcess) -> None:
    models = httpx.get(f"{guarded.url}/v1/models", headers=auth()).json()
    assert [m["id"] for m in models["data"]] == ["my-llm"]
    resp = httpx.post(f"{guarded.url}/v1/completions", headers=auth(), timeout=30,
                      json={"model": "my-llm", "prompt": "the quick", "max_tokens": 3})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "my-llm"
    # The headers still trace the response to the registered version and serving config.
    assert resp.headers["x-relctl-model"] == "tiny-llm" and resp.headers["x-relctl-version"] == "unregistered"
    other = httpx.post(f"{guarded.url}/v1/completions", headers=auth(), json={"model": "gpt-4", "prompt": "hi"})
    assert other.status_code == 400 and "my-llm" in other.json()["error"]["message"]
    schema = httpx.get(f"{guarded.url}/openapi.json", headers=auth()).json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_an_empty_key_is_refused_before_anything_loads(tiny_package: Path) -> None:
    result = CliRunner().invoke(serving_group, ["serve", str(tiny_package), "--api-key", " "])
    assert result.exit_code == 2, result.output
    assert "error: --api-key: empty" in result.output
