"""`relctl canary ADAPTER --server URL`: two versions of one adapter on ONE running base (docs/canary.md).

The base server (`relctl serve BASE@production --adapters`) serves the adapter's production version under
the adapter's name (`tiny-llm-support`); the candidate version is loaded beside it under its pinned name
(`tiny-llm-support:2`, POST /admin/adapters with the server's admin key, RELCTL_ADMIN_KEY), and the router
sends both arms to the same URL (with the completions key, RELCTL_API_KEY, when the server takes one),
rewriting each request's OpenAI `model` field to the arm's name. Judged exactly as every
canary (same judge, records and alias moves, release/canary/registry_mode.py). Afterwards the pinned name is
unloaded; on a pass the adapter's own name is first switched to the new production version (the engine
already holds it: no second load).

Everything that can be wrong with the input is found before the candidate alias moves or traffic flows:
no admin key, a server that does not answer, a version whose signed package binds it to another base than
the one the server runs (release/adapters/trust.py, whatever the registry's tags say), a server that does
not serve the adapter's production version.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.adapters.trust import KIND, BaseIdentity, check_bound
from release.core.errors import InputError, StageFailed
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.serving.adapters import pinned_name
from release.serving.admin_client import AdminClient, AdminError

if TYPE_CHECKING:
    from release.registry import Registry
    from release.signing.keys import Trust

API_KEY_ENV = "RELCTL_API_KEY"   # the completions key the arms' traffic sends, when the server has one


def is_adapter(mv: VersionRecord) -> bool:
    return mv.tags.get(T.KIND) == KIND


@dataclass(frozen=True)
class AdapterArms:
    """Both arms on one base server: the URL, the `model` each arm's requests carry, the completions key
    their traffic sends (None: the server takes none), the admin client that pins and settles them."""

    url: str
    model: str
    production: str
    candidate: str
    api_key: str | None
    admin: AdminClient

    @property
    def names(self) -> dict[str, str]:
        return {"production": self.model, "candidate": pinned_name(self.model, self.candidate)}

    @property
    def headers(self) -> dict[str, dict[str, str]]:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"production": auth, "candidate": auth}


def adapter_arms(server: str | None, model: str, production: VersionRecord, candidate: VersionRecord,
                 registry: Registry, trust: Trust, api_key: str | None = None,
                 admin_key: str | None = None) -> AdapterArms:
    """The arms on `server`, checked before traffic or any alias move: both versions are adapters whose
    signed packages bind them to the base the server runs (as the server states it), and the server serves
    `model` at its production version now. InputError (exit 2) otherwise."""
    if server is None:
        raise InputError(f"{model} is an adapter: its canary runs on the base server that serves it",
                         hint=f"relctl canary {model} --server http://HOST:PORT (relctl serve BASE@production "
                              "--adapters, RELCTL_ADMIN_KEY set to its admin key)")
    admin = AdminClient.of(server, admin_key, f"--server: loading {model}'s candidate on the base")
    for mv in (production, candidate):
        if not is_adapter(mv):
            raise InputError(f"{model} v{mv.version} is not an adapter (tag {T.KIND})",
                             hint="a canary of a whole model runs without --server")
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    arms = AdapterArms(admin.url, model, str(production.version), str(candidate.version), key or None, admin)
    listing = _listing(arms)
    base = BaseIdentity.from_dict(listing.get("base"))
    if base is None:
        raise InputError(f"--server {arms.url} does not state the base it serves (GET /admin/adapters)",
                         hint="run the base with this relctl: relctl serve BASE@production --adapters")
    check_versions_bound(registry, trust, [candidate, production], base)
    _check_traffic_key(arms)
    now = next((str(e.get("version")) for e in listing.get("adapters", [])
                if isinstance(e, dict) and e.get("served_name", e.get("model")) == model), None)
    if now != arms.production:
        where = f"serves {model} at v{now}" if now else f"does not serve {model}"
        raise InputError(f"the server at {arms.url} {where}; production is v{arms.production}",
                         hint=f"serve production there first: relctl rollback {model} --to {arms.production} "
                              f"--server {arms.url}, or POST /admin/adapters {{\"model\": \"{model}\"}}")
    return arms


def check_versions_bound(registry: Registry, trust: Trust, versions: list[VersionRecord], base: BaseIdentity) -> None:
    """Each version's package, verified (digest, signature, this version), bound to `base` by its manifest."""
    from release.registry.versions import fetch_verified  # noqa: PLC0415 - signing: only for an adapter canary

    with tempfile.TemporaryDirectory(prefix="relctl-canary-adapter-") as tmp:
        for mv in {str(v.version): v for v in versions}.values():
            package, _ = fetch_verified(registry, mv.name, str(mv.version), Path(tmp), mv, trust=trust)
            check_bound(package, f"{mv.name} v{mv.version}", base)


def _check_traffic_key(arms: AdapterArms) -> None:
    """The arms' traffic is let in (the server's completions key, when it takes one): refused now, not judged
    as errors of both arms later."""
    import httpx  # noqa: PLC0415 - as the admin client

    try:
        status = httpx.get(arms.url + "/v1/models", headers=arms.headers["production"], timeout=30).status_code
    except httpx.HTTPError as exc:
        raise InputError(f"--server {arms.url}/v1/models: {type(exc).__name__}: {exc}",
                         hint="is relctl serve BASE@production --adapters running there?") from exc
    if status in (401, 403):
        raise InputError(f"--server {arms.url}: the canary's traffic is refused (HTTP {status} on /v1/models)",
                         hint=f"set {API_KEY_ENV} to the server's completions key (--api-key), not its admin key")


def _listing(arms: AdapterArms) -> dict[str, Any]:
    try:
        return arms.admin.listing()
    except AdminError as exc:
        raise InputError(exc.message, hint=exc.hint) from exc


def load_candidate(arms: AdapterArms) -> dict[str, Any]:
    """The candidate version loaded beside production under its pinned name."""
    return arms.admin.pin(arms.names["candidate"])


def settle(arms: AdapterArms, passed: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """After the canary: on a pass the adapter's own name serves the new production version (the engine
    shares the pinned name's load); then the pinned name is unloaded. Best effort past a failure (the
    outcome is in the registry already): what went wrong is returned, not raised."""
    done: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if passed:
        steps.append(("switched", lambda: arms.admin.switch(arms.model)))
    steps.append(("unloaded", lambda: arms.admin.unload(arms.names["candidate"])))
    for label, step in steps:
        try:
            answer = step()
            done[label] = {k: answer[k] for k in ("model", "version", "served_name", "unloaded") if k in answer}
        except StageFailed as exc:
            say(f"warning: {exc.message}")
            done[label] = {"error": exc.message}
    return done
