"""`relctl canary MODEL`: production and candidate from the registry's aliases, the outcome moved back
into them (release.canary.outcome), and a rollback during the canary winning over it. An adapter's two
versions run on the one base server that serves it (`--server URL`, release/canary/adapter_mode.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from release.canary.adapter_mode import AdapterArms, adapter_arms, is_adapter, load_candidate, settle
from release.canary.outcome import finish_canary, start_canary
from release.canary.runner import CanaryResult, run_canary
from release.canary.servers import Registered, served
from release.canary.settings import CanaryConfig
from release.core.errors import InputError, ReleaseError
from release.registry import CANDIDATE, PRODUCTION, Registry, transitions
from release.registry import tags as T
from release.registry.client import open_registry
from release.registry.states import AWAITING_APPROVAL, REJECTED, alias_refusal
from release.registry.versions import fetch_package
from release.signing.keys import project_trust


def production_moved(registry: Registry, model: str, production: str) -> Callable[[], str | None]:
    """A should_stop for the runner: a reason once `production` no longer points at `production`."""

    def check() -> str | None:
        now = registry.aliases(model).get(PRODUCTION)
        if now != production:
            return f"production moved from v{production} to v{now} during the canary (the rollback wins)"
        return None

    return check


def run_model_canary(model: str, candidate_version: str | None, config: CanaryConfig, work: Path,
                     base_dir: Path | None, project_dir: Path, say: Callable[[str], None],
                     server: str | None = None) -> tuple[CanaryResult, dict[str, Any]]:
    """Serve production and candidate versions of `model`, run the canary, move the aliases. An adapter's
    versions are served on the base server at `server` instead (required for an adapter, refused otherwise)."""
    registry = open_registry(project_dir)
    registry.require_model(model)
    aliases = registry.aliases(model)
    production = aliases.get(PRODUCTION)
    if production is None:
        raise InputError(f"{model}: no production version to compare with",
                         hint="a first release has nothing to canary against; promote it without the canary")
    candidate = candidate_version or aliases.get(CANDIDATE)
    if candidate is None:
        raise InputError(f"{model}: no '{CANDIDATE}' alias", hint="pass --version V to put a version under canary")
    if candidate == production:
        raise InputError(f"{model}: v{candidate} already is production", hint="pass --version with another version")
    tags = registry.get_version(model, candidate).tags
    state = tags.get(T.RELEASE_STATE)
    if state in (AWAITING_APPROVAL, REJECTED):  # its pass could not move production: refused before serving
        why = alias_refusal(PRODUCTION, candidate, tags, None)
        raise InputError(f"{model}: v{candidate} cannot be canaried into production: {why}",
                         hint=f"relctl approve {model}/{candidate} --reason ..." if state == AWAITING_APPROVAL
                         else "release a new version: a rejected one never serves production")
    prod_mv = registry.get_version(model, production)
    trust = project_trust(project_dir)
    if is_adapter(prod_mv) or server is not None:
        # Checked against the running base (both signed packages bound to it, what it serves) before any alias
        # moves; the server checks the candidate's package again when it loads it.
        arms = adapter_arms(server, model, prod_mv, registry.get_version(model, candidate), registry, trust)
        return adapter_canary(registry, arms, aliases.get(CANDIDATE) != candidate, config, work, base_dir, say)
    packages = work / "packages"
    # Both verified (manifest digest and signature) before either is served or any alias moves.
    prod_pkg = fetch_package(registry, model, production, packages, trust=trust, warn=say).root
    cand_pkg = fetch_package(registry, model, candidate, packages, trust=trust, warn=say).root
    if aliases.get(CANDIDATE) != candidate:
        start_canary(registry, model, candidate)
    say(f"canary {model}: v{candidate} against production v{production}")
    try:
        registered = Registered(project_dir, model, production, candidate)
        with served(prod_pkg, cand_pkg, work, config, registered) as (prod, cand):
            result = run_canary(prod.url, cand.url, config, work, base_dir,
                                should_stop=production_moved(registry, model, production), progress=say)
    except ReleaseError as exc:
        transitions.drop_candidate(registry, model, "canary-error", f"canary could not run: {exc.message}", None)
        raise
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: the candidate does not stay aliased behind a dead canary
        transitions.unwind(registry, model, candidate, "canary interrupted")
        raise
    move = finish_canary(registry, model, candidate, production, result)
    extra = {"model": model, "production_version": production, "candidate_version": candidate,
             "alias_move": json.loads(move.to_json()) if move is not None else None}
    return result, extra


def adapter_canary(registry: Registry, arms: AdapterArms, nominate: bool, config: CanaryConfig, work: Path,
                   base_dir: Path | None, say: Callable[[str], None], release_run: str | None = None
                   ) -> tuple[CanaryResult, dict[str, Any]]:
    """The canary of adapter versions on one base: candidate loaded under its pinned name, both arms through
    the router to the same server, the outcome moved into the aliases, the pinned name unloaded.
    `release_run`: the adapter release that registered the candidate and runs its canary (as promote's gate)."""
    model, production, candidate = arms.model, arms.production, arms.candidate
    if nominate:
        start_canary(registry, model, candidate, release_run)
    say(f"canary {model}: v{candidate} against production v{production} on the base at {arms.url}")
    try:
        loaded = load_candidate(arms)
        say(f"{arms.names['candidate']} loaded beside {model} in {loaded.get('seconds')}s")
        result = run_canary(arms.url, arms.url, config, work, base_dir,
                            should_stop=production_moved(registry, model, production), progress=say,
                            models=arms.names, headers=arms.headers)
    except ReleaseError as exc:
        settle(arms, False, say)
        transitions.drop_candidate(registry, model, "canary-error", f"canary could not run: {exc.message}",
                                   release_run)
        raise
    except KeyboardInterrupt:
        settle(arms, False, say)
        transitions.unwind(registry, model, candidate, "canary interrupted", release_run)
        raise
    move = finish_canary(registry, model, candidate, production, result, release_run)
    promoted = registry.aliases(model).get(PRODUCTION) == candidate
    served = settle(arms, promoted, say)
    extra = {"model": model, "production_version": production, "candidate_version": candidate,
             "alias_move": json.loads(move.to_json()) if move is not None else None,
             "adapter": {"server": arms.url, "arms": arms.names, **served}}
    return result, extra
