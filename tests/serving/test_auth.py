"""`relctl serve --api-key` (Bearer, 401 with WWW-Authenticate, /health open), `--admin-key` (its own scope:
/admin/* and nothing else) and --served-model-name."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from release.serving.auth import KeyAuth
from release.serving.cli import serving_group
from release.serving.metrics import Identity, ServerMetrics
from release.serving.process import ServerProcess

KEY = "sk-test-0123456789abcdef"
ADMIN = "sk-admin-fedcba9876543210"


@pytest.fixture(scope="module")
def guarded(tiny_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(str(tiny_package), tmp_path_factory.mktemp("auth"), api_key=KEY,
                       served_model_name="my-llm", admin_key=ADMIN) as proc:
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


def test_completions_and_admin_keys_open_their_own_paths_only(guarded: ServerProcess) -> None:
    """A completions key cannot touch /admin (403), the admin key cannot complete (403): two scopes."""
    admin = httpx.get(f"{guarded.url}/admin/adapters", headers=auth())
    assert admin.status_code == 403 and "completions key cannot" in admin.json()["error"]["message"], admin.text
    as_admin = httpx.get(f"{guarded.url}/admin/adapters", headers=auth(ADMIN))
    assert as_admin.status_code == 404, as_admin.text   # let through: this server serves no adapters
    completion = httpx.post(f"{guarded.url}/v1/completions", headers=auth(ADMIN), json={"prompt": "hi"})
    assert completion.status_code == 403 and "admin key opens /admin only" in completion.text, completion.text
    metrics = httpx.get(f"{guarded.url}/metrics", headers=auth()).text
    assert 'relctl_rejected_total{reason="forbidden"} 2.0' in metrics


def test_without_an_admin_key_the_admin_paths_are_refused() -> None:
    """KeyAuth itself, in process (no model needed): no admin key configured means no admin at all, whatever
    is sent; a wrong admin key is 401; the completions key keeps its paths."""
    async def ok(_: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/admin/adapters", ok), Route("/v1/models", ok), Route("/health", ok)])
    metrics = ServerMetrics(Identity("m", "1", "cfg"), 0.0, lambda: 0, lambda: 0, lambda: {})

    def status(guard: KeyAuth, path: str, key: str | None) -> int:
        async def call() -> int:
            transport = httpx.ASGITransport(app=guard)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return (await client.get(path, headers=auth(key) if key else {})).status_code
        return asyncio.run(call())

    no_admin = KeyAuth(app, KEY, None, metrics)
    assert [status(no_admin, "/admin/adapters", k) for k in (None, KEY, ADMIN)] == [403, 403, 403]
    assert [status(no_admin, "/v1/models", k) for k in (None, KEY)] == [401, 200]
    both = KeyAuth(app, KEY, ADMIN, metrics)
    assert [status(both, "/admin/adapters", k) for k in (None, "wrong", KEY, ADMIN)] == [401, 401, 403, 200]
    assert status(both, "/admin", ADMIN) == 404 and status(both, "/administrator", ADMIN) == 403
    open_server = KeyAuth(app, None, ADMIN, metrics)   # no completions key: completions are open, admin is not
    assert [status(open_server, "/v1/models", k) for k in (None, ADMIN)] == [200, 200]
    assert [status(open_server, "/admin/adapters", k) for k in (None, ADMIN)] == [401, 200]
    assert status(both, "/health", None) == 200


def test_an_admin_key_equal_to_the_api_key_is_refused(tiny_package: Path) -> None:
    result = CliRunner().invoke(serving_group, ["serve", str(tiny_package), "--api-key", KEY, "--admin-key", KEY])
    assert result.exit_code == 2 and "--admin-key equals --api-key" in result.stderr, result.output
