"""An adapter's rollback is an alias move plus a switch on the running base (POST /admin/adapters): the base
process keeps serving, only the adapter changes. A base's rollback that would leave production adapters
serving on no base is refused (exit 2, naming them) unless the user says to strand them.

The order of an adapter's rollback (docs/adapters.md), every refusal before the alias moves:

1. `--server` without the admin key (RELCTL_ADMIN_KEY): refused before the registry is opened;
2. the target's package verified, and its signed manifest's base must be the base's production version
   (a version built for another base would leave the adapter served by nothing);
3. the server probed (GET /admin/adapters): it answers, takes the key, answers JSON as relctl serve
   --adapters does, and runs that base version;
4. the alias moves (release/registry/transitions.py, under the adapter's lease);
5. the switch on the server; if it fails now, the error says that production moved and prints the command
   that moves it back (a server that follows the registry switches by itself within its interval).
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.adapters.bound import base_problem, built_for
from release.adapters.serving import production_adapters
from release.core.errors import InputError, ReleaseError, StageFailed
from release.registry import PRODUCTION, AliasMove, Registry

STRAND_FLAG = "--strand-adapters"
ADMIN_KEY_ENV = "RELCTL_ADMIN_KEY"   # the server's admin credential; a completions key does not reach /admin
PROBE_TIMEOUT_S = 30.0
SERVER_HINT = "point --server at the relctl serve BASE@production --adapters that serves the adapter's base"


def refuse_stranding(registry: Registry, model: str, current: str | None, target: str) -> None:
    """InputError when moving `model`'s production from v`current` to v`target` strands adapters built for
    v`current` (their production versions name it as their base)."""
    if current is None or current == target:
        return
    stranded = sorted(production_adapters(registry, model, current))
    if stranded:
        raise InputError(f"{model}: rolling production back from v{current} to v{target} would strand the adapters "
                         f"built for v{current}: {', '.join(stranded)}",
                         hint=f"release them onto v{target} first (relctl promote RUN --onto {model}/{target}), "
                              f"or pass {STRAND_FLAG} to roll back anyway")


def refuse_other_base(registry: Registry, model: str, version: str, manifest: dict[str, Any]) -> tuple[str, str] | None:
    """(base model, base version) an adapter package is bound to, from its signed manifest; InputError (exit 2)
    when that base version is not its base's production (the adapter would serve on no running base).
    None for a whole model's package."""
    bound = built_for(manifest)
    if bound is None:
        return None
    base_model, base_version, _digest = bound
    production = registry.version_for(base_model, PRODUCTION) if base_model and registry.model_exists(base_model) \
        else None
    now = str(production.version) if production is not None else None
    if now is not None and base_problem(manifest, f"{model} v{version}", base_model, now) is None:
        return base_model, base_version
    built = f"{base_model or '?'} v{base_version or '?'}"
    if now is None:
        raise InputError(f"{model}: production may not move to v{version}: it was built for {built} (its signed "
                         f"package says so), and {base_model or 'that base'} has no production version",
                         hint=f"promote a version of {base_model or 'the base'} first")
    raise InputError(f"{model}: production may not move to v{version}: it was built for {built} (its signed "
                     f"package says so), but {base_model}'s production is v{now}, so no running base would serve it",
                     hint=f"roll back to a version built for {base_model} v{now} (relctl status {model}), or release "
                          f"one onto it: relctl promote RUN --onto {base_model}@production")


@dataclass
class SwitchServer:
    """`relctl rollback ADAPTER --server URL`: the base server switched after the move, and its answer."""

    url: str
    admin_key: str
    answer: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")


def switch_server(url: str | None, environ: dict[str, str] | None = None) -> SwitchServer | None:
    """The `--server` of a rollback with its admin key; InputError (exit 2) without one, before the registry
    is opened (a rollback that cannot switch must not move the alias first)."""
    if url is None:
        return None
    key = (environ if environ is not None else dict(os.environ)).get(ADMIN_KEY_ENV, "").strip()
    if not key:
        raise InputError(f"--server {url}: switching an adapter needs the server's admin key, and {ADMIN_KEY_ENV} "
                         "is not set; nothing moved",
                         hint=f"set {ADMIN_KEY_ENV} to the admin key the server was started with, or leave --server "
                              "out (a server that follows the registry switches within its interval)")
    return SwitchServer(url, key)


def probe_server(server: SwitchServer, model: str, base: tuple[str, str]) -> None:
    """Before the alias moves: the server answers GET /admin/adapters with JSON, as relctl serve --adapters
    does, takes the admin key and runs `base` (model, version). Exit 4 when it cannot be reached, 2 when it is
    not such a server or refuses the key; nothing moved either way."""
    import httpx  # noqa: PLC0415 - only a rollback with --server

    where = f"--server {server.url}"
    try:
        response = httpx.get(server.base_url + "/admin/adapters", timeout=PROBE_TIMEOUT_S,
                             headers={"Authorization": f"Bearer {server.admin_key}"})
    except httpx.HTTPError as exc:
        raise StageFailed(f"{where}: cannot reach it ({exc.__class__.__name__}: {exc}); nothing moved",
                          hint="start relctl serve BASE@production --adapters there (or fix the URL), then run "
                               "the rollback again; without --server the alias moves and a following server "
                               "switches by itself") from exc
    if response.status_code in (401, 403):
        raise InputError(f"{where}: the admin key was refused (HTTP {response.status_code}); nothing moved",
                         hint=f"set {ADMIN_KEY_ENV} to the admin key the server was started with")
    if response.status_code == 404:
        raise InputError(f"{where} serves no adapters (HTTP 404 on /admin/adapters); nothing moved",
                         hint="start it with relctl serve BASE@production --adapters, or " + SERVER_HINT)
    if response.status_code >= 500:
        raise StageFailed(f"{where}: HTTP {response.status_code} on /admin/adapters; nothing moved",
                          hint="see the server's log, then run the rollback again")
    kind = response.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    try:
        body = response.json()
    except ValueError:
        body = None
    served = (response.headers.get("x-relctl-model"), response.headers.get("x-relctl-version"))
    if response.status_code != 200 or not isinstance(body, dict) or "adapters" not in body or None in served:
        raise InputError(f"{where}: answered HTTP {response.status_code} ({kind}) on /admin/adapters, not relctl "
                         "serve's JSON; nothing moved", hint=SERVER_HINT)
    if served != base:
        raise InputError(f"{where} runs {served[0]} v{served[1]}, but {model}'s target is built for {base[0]} "
                         f"v{base[1]}; nothing moved", hint=SERVER_HINT)


def switch_after_move(server: SwitchServer, model: str, move: AliasMove, project_dir: Path) -> dict[str, Any]:
    """The switch on the server once production moved. A failure now is said plainly: production moved, the
    server did not follow, and the exact command that moves it back (exit 4)."""
    before, after = move.changes.get(PRODUCTION, [None, None])
    try:
        answer = reload_on_server(server.base_url, model, server.admin_key)
    except (ReleaseError, ValueError) as exc:  # ValueError: a body that is not JSON
        why = exc.message if isinstance(exc, ReleaseError) else f"its answer was not JSON ({exc})"
        raise StageFailed(f"{model}: production moved from v{before} to v{after}, but the switch on {server.url} "
                          f"failed: {why}", hint=undo_hint(model, before, server.url, project_dir)) from exc
    server.answer = answer
    return answer


def undo_hint(model: str, before: str | None, url: str, project_dir: Path) -> str:
    """The exact command that puts production back where it was (or what to do when it had none)."""
    switch = (f"POST {url.rstrip('/')}/admin/adapters {{\"model\": \"{model}\"}} once the server answers (a server "
              "that follows the registry switches by itself within its interval)")
    if before is None:
        return f"production had no version before; to keep the move, {switch}"
    where = [] if project_dir == Path.cwd().resolve() else ["--project-dir", str(project_dir)]
    undo = shlex.join(["relctl", *where, "rollback", model, "--to", before, "--reason",
                       f"undo: the switch on {url} failed"])
    return f"to undo it: {undo}; to keep it, {switch}"


def reload_on_server(url: str, model: str, api_key: str | None, timeout_s: float = 120) -> dict[str, Any]:
    """Tell the base server at `url` to serve `model`'s production version now; its answer plus the seconds."""
    import httpx  # noqa: PLC0415

    if not api_key:
        raise InputError("--server: the admin path needs the server's API key",
                         hint="set RELCTL_API_KEY to the key the server was started with")
    started = time.monotonic()
    try:
        response = httpx.post(url.rstrip("/") + "/admin/adapters", json={"model": model}, timeout=timeout_s,
                              headers={"Authorization": f"Bearer {api_key}"})
    except httpx.HTTPError as exc:
        raise InputError(f"--server {url}: {exc}", hint="is relctl serve --adapters running there?") from exc
    if response.status_code != 200:
        raise InputError(f"--server {url}: HTTP {response.status_code}: {response.text[:300]}",
                         hint="the alias moved; load it by hand: POST /admin/adapters {\"model\": ...}")
    answer: dict[str, Any] = response.json()
    answer["round_trip_s"] = round(time.monotonic() - started, 3)
    return answer
