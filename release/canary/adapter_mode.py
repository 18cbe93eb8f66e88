"""`relctl canary ADAPTER --server URL`: two versions of one adapter on ONE running base (docs/canary.md).

The base server (`relctl serve BASE@production --adapters`) serves the adapter's production version under
the adapter's name (`tiny-llm-support`); the candidate version is loaded beside it under its pinned name
(`tiny-llm-support:2`, POST /admin/adapters with the server's API key), and the router sends both arms to
the same URL, rewriting each request's OpenAI `model` field to the arm's name. Judged exactly as every
canary (same judge, records and alias moves, release/canary/registry_mode.py). Afterwards the pinned name is
unloaded; on a pass the adapter's own name is first switched to the new production version (the engine
already holds it: no second load).

Everything that can be wrong with the input is found before the candidate alias moves or traffic flows:
no API key, a server that does not answer, one that runs another base version than the adapter was built
for, one that does not serve the adapter's production version.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from release.adapters.serving import KIND, pinned_name
from release.core.errors import InputError, StageFailed
from release.registry import tags as T
from release.registry.records import VersionRecord

API_KEY_ENV = "RELCTL_API_KEY"
ADMIN_TIMEOUT_S = 300.0  # a load fetches and verifies the package, then the engine loads it


def is_adapter(mv: VersionRecord) -> bool:
    return mv.tags.get(T.KIND) == KIND


@dataclass(frozen=True)
class AdapterArms:
    """Both arms on one base server: the URL, the `model` each arm's requests carry, the admin headers."""

    url: str
    model: str
    production: str
    candidate: str
    api_key: str

    @property
    def names(self) -> dict[str, str]:
        return {"production": self.model, "candidate": pinned_name(self.model, self.candidate)}

    @property
    def headers(self) -> dict[str, dict[str, str]]:
        auth = {"Authorization": f"Bearer {self.api_key}"}
        return {"production": auth, "candidate": auth}

    def admin(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST an admin request; StageFailed (after the candidate alias moved: unwound by the caller)."""
        try:
            resp = httpx.post(self.url + path, json=body, headers=self.headers["production"], timeout=ADMIN_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise StageFailed(f"--server {self.url}{path}: {exc.__class__.__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise StageFailed(f"--server {self.url}{path} {body}: HTTP {resp.status_code}: {resp.text[:300]}")
        answer: dict[str, Any] = resp.json()
        return answer


def adapter_arms(server: str | None, model: str, production: VersionRecord, candidate: VersionRecord,
                 api_key: str | None = None) -> AdapterArms:
    """The arms on `server`, checked: both versions are adapters of the base version the server runs, and
    the server serves `model` at its production version now. InputError (exit 2) otherwise, before traffic."""
    if server is None:
        raise InputError(f"{model} is an adapter: its canary runs on the base server that serves it",
                         hint=f"relctl canary {model} --server http://HOST:PORT (relctl serve BASE@production "
                              "--adapters, RELCTL_API_KEY set to its key)")
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if not key:
        raise InputError(f"--server: loading {model}'s candidate on the base needs the server's API key",
                         hint=f"set {API_KEY_ENV} to the key the server was started with")
    for mv in (production, candidate):
        if not is_adapter(mv):
            raise InputError(f"{model} v{mv.version} is not an adapter (tag {T.KIND})",
                             hint="a canary of a whole model runs without --server")
    base = (production.tags.get(T.BASE_MODEL), production.tags.get(T.BASE_VERSION))
    arms = AdapterArms(server.rstrip("/").removesuffix("/v1"), model, str(production.version),
                       str(candidate.version), key)
    served = _served_base(arms)
    for mv in (candidate, production):
        built = (mv.tags.get(T.BASE_MODEL), mv.tags.get(T.BASE_VERSION))
        if built != served:
            raise InputError(f"{model} v{mv.version} was built for {built[0]} v{built[1]}, but the server at "
                             f"{arms.url} runs {served[0]} v{served[1]}",
                             hint=f"point --server at the relctl serve of {base[0]}@production --adapters, or "
                                  f"release the adapter onto {served[0]} v{served[1]} first")
    now = _served_version(arms)
    if now != arms.production:
        where = f"serves {model} at v{now}" if now else f"does not serve {model}"
        raise InputError(f"the server at {arms.url} {where}; production is v{arms.production}",
                         hint=f"serve production there first: relctl rollback {model} --to {arms.production} "
                              f"--server {arms.url}, or POST /admin/adapters {{\"model\": \"{model}\"}}")
    return arms


def _get(arms: AdapterArms, path: str) -> Any:
    try:
        resp = httpx.get(arms.url + path, headers=arms.headers["production"], timeout=30)
    except httpx.HTTPError as exc:
        raise InputError(f"--server {arms.url}: {exc.__class__.__name__}: {exc}",
                         hint="is relctl serve BASE@production --adapters running there?") from exc
    if resp.status_code in (401, 403):
        raise InputError(f"--server {arms.url}{path}: HTTP {resp.status_code}: the API key was refused",
                         hint=f"set {API_KEY_ENV} to the key the server was started with")
    if resp.status_code == 404 and path.startswith("/admin"):
        raise InputError(f"--server {arms.url} serves no adapters (HTTP 404 on {path})",
                         hint="start it with relctl serve BASE@production --adapters")
    if resp.status_code != 200:
        raise InputError(f"--server {arms.url}{path}: HTTP {resp.status_code}: {resp.text[:200]}",
                         hint="is relctl serve BASE@production --adapters running there?")
    try:
        return resp.json()
    except ValueError as exc:
        raise InputError(f"--server {arms.url}{path}: not JSON", hint="point --server at relctl serve") from exc


def _served_base(arms: AdapterArms) -> tuple[str | None, str | None]:
    """(model, version) of the base the server runs, from the first card of its /v1/models."""
    data = _get(arms, "/v1/models")
    cards = data.get("data") if isinstance(data, dict) else None
    if not cards or not isinstance(cards[0], dict):
        raise InputError(f"--server {arms.url}: /v1/models lists no model", hint="point --server at relctl serve")
    card = cards[0]
    return card.get("root"), None if card.get("version") is None else str(card.get("version"))


def _served_version(arms: AdapterArms) -> str | None:
    data = _get(arms, "/admin/adapters")
    for entry in data.get("adapters", []) if isinstance(data, dict) else []:
        if isinstance(entry, dict) and entry.get("served_name", entry.get("model")) == arms.model:
            return str(entry.get("version"))
    return None


def load_candidate(arms: AdapterArms) -> dict[str, Any]:
    """The candidate version loaded beside production under its pinned name."""
    return arms.admin("/admin/adapters", {"model": arms.names["candidate"]})


def settle(arms: AdapterArms, passed: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """After the canary: on a pass the adapter's own name serves the new production version (the engine
    shares the pinned name's load); then the pinned name is unloaded. Best effort past a failure (the
    outcome is in the registry already): what went wrong is returned, not raised."""
    done: dict[str, Any] = {}
    steps: list[tuple[str, str, dict[str, Any]]] = []
    if passed:
        steps.append(("switched", "/admin/adapters", {"model": arms.model}))
    steps.append(("unloaded", "/admin/adapters/unload", {"model": arms.names["candidate"]}))
    for label, path, body in steps:
        try:
            answer = arms.admin(path, body)
            done[label] = {k: answer[k] for k in ("model", "version", "served_name", "unloaded") if k in answer}
        except StageFailed as exc:
            say(f"warning: {exc.message}")
            done[label] = {"error": exc.message}
    return done
