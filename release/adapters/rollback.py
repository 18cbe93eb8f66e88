"""An adapter's rollback is an alias move plus a switch on the running base (POST /admin/adapters): the base
process keeps serving, only the adapter changes. A base's rollback that would leave production adapters
serving on no base is refused (exit 2, naming them) unless the user says to strand them.

The order of an adapter's rollback (docs/adapters.md), every refusal before the alias moves:

1. `--server` without the admin key (RELCTL_ADMIN_KEY): refused before the registry is opened;
2. the target's package verified, and the base its signed manifest binds it to (adapters/trust.py
   binding_of) must be the base's production version (one built for another base would serve on nothing);
3. the server probed (GET /admin/adapters through the one admin client, release/serving/admin_client.py):
   it answers, takes the key, answers as relctl serve --adapters does, and the base it states is one the
   target's signed package is bound to (trust.check_bound, the check its own switch will make);
4. the alias moves (release/registry/transitions.py, under the adapter's lease);
5. the switch on the server; if it fails now, the error says that production moved and prints the command
   that moves it back (a server that follows the registry switches by itself within its interval).
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.adapters.trust import KIND, AdapterBinding, BaseIdentity, binding_of, check_bound, production_adapters
from release.core.errors import InputError, StageFailed
from release.core.package import PackageManifest
from release.registry import PRODUCTION, AliasMove, Registry
from release.serving.admin_client import ADMIN_KEY_ENV, AdminClient, AdminError

STRAND_FLAG = "--strand-adapters"
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


def refuse_other_base(registry: Registry, model: str, version: str, package: PackageManifest) -> AdapterBinding | None:
    """The base an adapter package is bound to by its signed manifest; InputError (exit 2) when that base
    version is not its base's production (the adapter would serve on no running base). None for a whole
    model's package."""
    if package.data.get("kind") != KIND:
        return None
    bound = binding_of(package, f"{model} v{version}")
    production = registry.version_for(bound.model, PRODUCTION) if registry.model_exists(bound.model) else None
    now = str(production.version) if production is not None else None
    if now == bound.version:
        return bound
    built = f"{bound.model} v{bound.version}"
    if now is None:
        raise InputError(f"{model}: production may not move to v{version}: it was built for {built} (its signed "
                         f"package says so), and {bound.model} has no production version",
                         hint=f"promote a version of {bound.model} first")
    raise InputError(f"{model}: production may not move to v{version}: it was built for {built} (its signed "
                     f"package says so), but {bound.model}'s production is v{now}, so no running base would serve it",
                     hint=f"roll back to a version built for {bound.model} v{now} (relctl status {model}), or release "
                          f"one onto it: relctl promote RUN --onto {bound.model}@production")


@dataclass
class SwitchServer:
    """`relctl rollback ADAPTER --server URL`: the base server's admin client, and its answer to the switch."""

    client: AdminClient
    answer: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.client.url


def switch_server(url: str | None) -> SwitchServer | None:
    """The `--server` of a rollback with its admin key (RELCTL_ADMIN_KEY); InputError (exit 2) without one,
    before the registry is opened (a rollback that cannot switch must not move the alias first)."""
    if url is None:
        return None
    try:
        return SwitchServer(AdminClient.of(url, what=f"--server {url}"))
    except InputError as exc:
        raise InputError(f"{exc.message}, and {ADMIN_KEY_ENV} is not set; nothing moved",
                         hint=f"set {ADMIN_KEY_ENV} to the admin key the server was started with (--admin-key), or "
                              "leave --server out (a server that follows the registry switches within its "
                              "interval)") from exc


def probe_server(server: SwitchServer, label: str, package: PackageManifest) -> None:
    """Before the alias moves: the server answers GET /admin/adapters as relctl serve --adapters does, takes
    the admin key, and states a base the adapter package `label` is bound to. Exit 4 when it cannot be reached
    (or fails), 2 when it is not such a server, refuses the key or runs another base; nothing moved either way."""
    where = f"--server {server.url}"
    try:
        listing = dataclasses.replace(server.client, timeout_s=PROBE_TIMEOUT_S).listing()
    except AdminError as exc:
        raise probe_refusal(where, exc) from exc
    base = BaseIdentity.from_dict(listing.get("base"))
    if base is None or not isinstance(listing.get("adapters"), list):
        raise InputError(f"{where}: answered /admin/adapters without the base and adapters relctl serve --adapters "
                         "states, not relctl serve's JSON; nothing moved", hint=SERVER_HINT)
    try:
        check_bound(package, label, base)  # the check the server's own switch makes: refused here, before the move
    except InputError as exc:
        raise InputError(f"{where}: {exc.message}; nothing moved", hint=SERVER_HINT) from exc


def probe_refusal(where: str, exc: AdminError) -> InputError | StageFailed:
    """What a failed probe means for the rollback: exit 4 for a server that cannot be reached or fails, exit 2
    for one that refuses the key or is not relctl serve --adapters (never 3: a bad answer is no bug of ours)."""
    if exc.status is None:
        return StageFailed(f"{where}: cannot reach it ({exc.reason}); nothing moved",
                           hint="start relctl serve BASE@production --adapters there (or fix the URL), then run the "
                                "rollback again; without --server the alias moves and a following server switches "
                                "by itself")
    if exc.status in (401, 403):
        return InputError(f"{where}: the admin key was refused (HTTP {exc.status}: {exc.reason}); nothing moved",
                          hint=exc.hint)
    if exc.status == 404:
        return InputError(f"{where} serves no adapters (HTTP 404 on /admin/adapters); nothing moved",
                          hint="start it with relctl serve BASE@production --adapters, or " + SERVER_HINT)
    if exc.status >= 500:
        return StageFailed(f"{where}: HTTP {exc.status} on /admin/adapters ({exc.reason}); nothing moved",
                           hint="see the server's log, then run the rollback again")
    return InputError(f"{where}: answered HTTP {exc.status} on /admin/adapters ({exc.reason}), not relctl serve's "
                      "JSON; nothing moved", hint=SERVER_HINT)


def switch_after_move(server: SwitchServer, model: str, move: AliasMove, project_dir: Path) -> dict[str, Any]:
    """The switch on the server once production moved. A failure now is said plainly: production moved, the
    server did not follow, and the exact command that moves it back (exit 4)."""
    before, after = move.changes.get(PRODUCTION, [None, None])
    try:
        answer = server.client.switch(model)
    except AdminError as exc:
        answered = f"HTTP {exc.status}" if exc.status is not None else "no answer"
        raise StageFailed(f"{model}: production moved from v{before} to v{after}, but the switch on {server.url} "
                          f"failed: {answered} ({exc.reason})",
                          hint=undo_hint(model, before, server.url, project_dir)) from exc
    server.answer = answer
    return answer


def undo_hint(model: str, before: str | None, url: str, project_dir: Path) -> str:
    """The exact command that puts production back where it was (or what to do when it had none)."""
    switch = (f"POST {url}/admin/adapters {{\"model\": \"{model}\"}} once the server answers (a server that "
              "follows the registry switches by itself within its interval)")
    if before is None:
        return f"production had no version before; to keep the move, {switch}"
    where = [] if project_dir == Path.cwd().resolve() else ["--project-dir", str(project_dir)]
    undo = shlex.join(["relctl", *where, "rollback", model, "--to", before, "--reason",
                       f"undo: the switch on {url} failed"])
    return f"to undo it: {undo}; to keep it, {switch}"
