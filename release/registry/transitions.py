"""The release-state transitions: every write that moves a version through its states (registry/states.py)
together with the aliases that follow it, one named function each.

    created_state       (new version)                  -> registering (promote) | registered (relctl register)
    adopt               (a crashed release's version)  -> registering again, finished by this release
    nominate            candidate -> version           (state unchanged: register, the canary's start, a re-gate)
    promote             production -> version, previous -> what it was   -> released
    reject              candidate removed              -> rejected, with the reason
    await_approval      (aliases unchanged)            -> awaiting-approval, with the production it was gated against
    approve             production -> version, under the lease          -> approved -> released
    unwind              candidate removed if it names the version; registering -> stopped
    drop_candidate      candidate removed              (state unchanged: a canary that could not run)
    rollback            production -> previous (or a named version), previous -> what that one replaced
                                                       (state unchanged; the state rule decides, or
                                                       --allow-unreleased, recorded)
    regated             (aliases unchanged)            a history entry: new gate results on what serves

Promote (release/pipeline/promote.py), register (release/stages/register.py), the canary's outcome
(release/canary/outcome.py), approve (release/pipeline/approve.py) and rollback (release/commands/api.py) call
these; none writes the state tag, takes the model's lease or composes an alias move of its own
(tests/architecture/test_layering.py checks it). The rule of which alias may point at which state is
registry/states.py, checked by Registry.locked_move under the model's lease for every move made here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from release.core.errors import InputError, RegistryError
from release.registry import CANDIDATE, PREVIOUS, PRODUCTION, AliasMove, Registry
from release.registry import tags as T
from release.registry.lock import retry_busy
from release.registry.states import (
    APPROVED,
    AWAITING_APPROVAL,
    REGISTERED,
    REGISTERING,
    REJECTED,
    RELEASED,
    STOPPED,
)

# Passed as expected_production when the caller has no comparison to protect (relctl register).
NOT_CHECKED = "unchecked"
CANARY_STATUS = T.gate_status("canary")


class ProductionMoved(RegistryError):
    """Production changed while the gates ran: their comparison no longer holds (exit 4)."""


def production_moved(name: str, expected: str | None, now: str | None, version: str, what: str) -> ProductionMoved:
    """The one refusal for a move whose gates compared with `expected` while production is `now`."""
    was = f"v{expected}" if expected else "no production version"
    return ProductionMoved(f"{name}: production moved from {was} to {f'v{now}' if now else 'none'} while the gates "
                           f"ran; {what}",
                           hint="production changed under this release (a rollback?); re-run relctl promote to gate "
                                "the candidate against the new production")


def _to_production(current: Mapping[str, str], version: str, clear_candidate: bool) -> dict[str, str | None]:
    """production -> version, previous -> what production was (if another), candidate cleared when asked."""
    changes: dict[str, str | None] = {PRODUCTION: version}
    now = current.get(PRODUCTION)
    if now is not None and now != version:
        changes[PREVIOUS] = now
    if clear_candidate:
        changes[CANDIDATE] = None
    return changes


def created_state(target_alias: str) -> dict[str, str]:
    """The state tag a new version is created with: `registering` until a release finishes it, `registered`
    when nothing will (relctl register without --production: no gate ran, no alias moves)."""
    return {T.RELEASE_STATE: REGISTERED if target_alias == "none" else REGISTERING}


def adopt(registry: Registry, name: str, version: str, tags: Mapping[str, str]) -> None:
    """A version a crashed (or interrupted) release created, finished by this one: `tags` (this release's
    evidence) and `registering` again (a canary cut short left it `stopped`)."""
    registry.set_version_tags(name, version, {**tags, T.RELEASE_STATE: REGISTERING})


def nominate(registry: Registry, name: str, version: str, action: str, reason: str,
             release_run: str | None) -> AliasMove | None:
    """`candidate` -> version (one history entry); the version's state does not change."""
    return registry.move_aliases(name, {CANDIDATE: version}, action, reason, release_run)


def promote(registry: Registry, name: str, version: str, reason: str, release_run: str | None,
            expected_production: str | None = NOT_CHECKED, clear_candidate: bool = False,
            action: str = "promote") -> tuple[AliasMove | None, list[str]]:
    """`production` -> version, `previous` -> what production was (and `candidate` cleared after a canary),
    in one history entry; refused if production moved meanwhile; then the version is `released`."""

    def decide(current: dict[str, str]) -> dict[str, str | None]:
        now = current.get(PRODUCTION)
        if expected_production != NOT_CHECKED and now != expected_production:
            raise production_moved(name, expected_production, now, version,
                                   f"v{version} was registered but not promoted")
        return _to_production(current, version, clear_candidate)

    move, notes = registry.locked_move(name, decide, action, reason, release_run)
    registry.set_version_tag(name, version, T.RELEASE_STATE, RELEASED)
    return move, notes


def reject(registry: Registry, name: str, version: str, reason: str, release_run: str | None, *,
           action: str = "reject", tags: Mapping[str, str] | None = None) -> AliasMove | None:
    """A gate or the canary rejected the version: tagged `rejected` with the reason (and `tags`, e.g. the
    canary's status), then `candidate` removed; production never moves."""
    registry.set_version_tags(name, version, {**(tags or {}), T.RELEASE_STATE: REJECTED, T.REJECTED_REASON: reason})
    return registry.move_aliases(name, {CANDIDATE: None}, action, reason, release_run)


def await_approval(registry: Registry, name: str, version: str, gated_against: str | None) -> None:
    """Every gate passed under require_approval: the version waits as `candidate` for relctl approve, with the
    production it was compared with recorded (an approval after production moved is refused)."""
    registry.set_version_tags(name, version, {T.RELEASE_STATE: AWAITING_APPROVAL, T.GATED_AGAINST: gated_against or ""})


def approve(registry: Registry, name: str, version: str, check: Callable[[dict[str, str], dict[str, str]], None],
            approval_tags: Mapping[str, str], reason: str, release_run: str | None,
            user: str) -> tuple[AliasMove | None, list[str]]:
    """Under the model's lease: `check(version's tags, current aliases)` (another approve, a rollback or a
    rejection may have got here first; it raises to refuse), the approval written and the version `approved`,
    production moved to it (candidate cleared if it was this version) in one history entry whose user is the
    approver; then `released`. An approve that dies in between leaves it `approved`, which a second finishes."""

    def decide(current: dict[str, str]) -> dict[str, str | None]:
        check(dict(registry.get_version(name, version).tags), current)
        registry.set_version_tags(name, version, {**approval_tags, T.RELEASE_STATE: APPROVED})
        return _to_production(current, version, clear_candidate=current.get(CANDIDATE) == version)

    move, notes = registry.locked_move(name, decide, "approve", reason, release_run, user=user)
    registry.set_version_tag(name, version, T.RELEASE_STATE, RELEASED)
    return move, notes


def unwind(registry: Registry, name: str, version: str, reason: str,
           release_run: str | None = None) -> AliasMove | None:
    """A canary cut short (a rollback won, a signal): `candidate` removed if it still names the version,
    gate.canary.status=stopped, and a version still `registering` becomes `stopped`, never left half-released.

    Runs while the process unwinds, often right after the canary's servers wrote to the same SQLite store:
    each write is retried while the store answers "database is locked".
    """

    def drop(current: dict[str, str]) -> dict[str, str | None]:
        return {CANDIDATE: None} if current.get(CANDIDATE) == version else {}

    move, _ = retry_busy(lambda: registry.locked_move(name, drop, "canary-stopped", reason, release_run))
    state = retry_busy(lambda: registry.get_version(name, version).tags.get(T.RELEASE_STATE))
    tags = {CANARY_STATUS: "stopped", **({T.RELEASE_STATE: STOPPED} if state == REGISTERING else {})}
    retry_busy(lambda: registry.set_version_tags(name, version, tags))
    return move


def drop_candidate(registry: Registry, name: str, action: str, reason: str,
                   release_run: str | None) -> AliasMove | None:
    """`candidate` removed whatever it names; no version changes state (a canary that could not run)."""
    return registry.move_aliases(name, {CANDIDATE: None}, action, reason, release_run)


def rollback(registry: Registry, name: str, to_version: str | None, check: Callable[[str, dict[str, str]], None],
             reason: str, override: bool = False) -> tuple[AliasMove | None, list[str]]:
    """Under the model's lease: production -> `to_version` (None: the `previous` alias as it is now),
    previous -> what that version replaced when it was promoted (none: no previous), in one history entry.
    `check(target, current aliases)` refuses by raising (the package verified, adapters stranded or built
    for another base): it runs on the aliases as they are under the lease, so two rollbacks at once cannot
    both act on the same state. The version's release state is unchanged; the state rule (registry/states.py)
    refuses a version that never passed its gates unless `override` (--allow-unreleased, recorded)."""

    def decide(current: dict[str, str]) -> dict[str, str | None]:
        target = to_version or current.get(PREVIOUS)
        if target is None:
            raise InputError(f"{name}: no '{PREVIOUS}' alias, so there is nothing to roll back to",
                             hint="pass --to VERSION to choose a version explicitly")
        if target == current.get(PRODUCTION):
            raise InputError(f"{name}: production already is v{target}", hint="pass --to VERSION for another version")
        check(target, current)
        return {PRODUCTION: target, PREVIOUS: registry.replaced_by(name, target)}

    return registry.locked_move(name, decide, "rollback", reason, release_run=None, override=override)


def regated(registry: Registry, name: str, reason: str, release_run: str | None) -> AliasMove:
    """A history entry that moves no alias: a release gated the version that already serves again."""
    return registry.record_event(name, "re-gated", reason, release_run)
