"""The one rule for which versions an alias may point at, by their `relctl.release_state`.

Every alias move goes through Registry.locked_move, which asks `alias_refusal` under the model's lease
for each alias it would point somewhere new, so register, promote, the canary's start and finish and
rollback all obey the same table:

    state          production                         candidate
    released       yes                                yes
    registered     yes (registered on purpose, no gate ran)   yes
    (none)         yes (versions from before the state tag)   yes
    registering    only by the release run creating it        only by the release run creating it
    stopped        no: its canary was cut short                yes (a canary may run again)
    rejected       no: a gate or the canary rejected it        no
    awaiting-approval  no: it passed its gates and waits for `relctl approve`   yes
    approved       yes (approve moves it, under the lease)     yes

`awaiting-approval` is where a version that passed every gate stops when release.yaml sets
`require_approval`: production does not move until `relctl approve MODEL/VERSION` records who approved
it (release/pipeline/approve.py), which marks it `approved` under the model's lease and moves production
in the same locked move, then `released`. Only such a version may be approved (`approvable`).

The moves themselves, each a named function that writes the state and moves the aliases together, are
release/registry/transitions.py.

`previous` is not checked: it only ever receives what production was. A refused move is bad input
(exit 2) naming the state; `relctl rollback --allow-unreleased` is the one override, recorded in the
history entry's reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from release.registry import tags as T

REGISTERING, RELEASED, REGISTERED, REJECTED, STOPPED = "registering", "released", "registered", "rejected", "stopped"
AWAITING_APPROVAL, APPROVED = "awaiting-approval", "approved"
CHECKED_ALIASES = ("production", "candidate")
OVERRIDE_FLAG = "--allow-unreleased"

_WHY = {
    REGISTERING: "it is still being registered (its release never finished: gates or canary not passed)",
    STOPPED: "its canary was cut short before it passed",
    REJECTED: "a gate or the canary rejected it",
    AWAITING_APPROVAL: "it passed its gates and waits for an approval: relctl approve MODEL/VERSION --reason ...",
}
# Why `relctl approve` refuses a version in each state: only a gated, passed version waits for one.
_NOT_APPROVABLE = {
    None: "it was not released by relctl promote (no release state): no gate ran on it",
    REGISTERED: "it was registered with `relctl register`: no gate ran on it",
    REGISTERING: "its release never finished (its gates or canary did not pass)",
    REJECTED: "a gate or the canary rejected it",
    STOPPED: "its canary was cut short before it passed",
    RELEASED: "it is already released (it passed its gates without needing an approval, or was approved)",
}


def alias_refusal(alias: str, version: str, tags: Mapping[str, str], release_run: str | None) -> str | None:
    """Why `alias` may not point at `version` (whose tags are `tags`) in a move by `release_run`; None: it may."""
    if alias not in CHECKED_ALIASES:
        return None
    state = tags.get(T.RELEASE_STATE)
    if state in (None, RELEASED, REGISTERED, APPROVED):
        return None
    if state == REGISTERING and release_run is not None and tags.get(T.RELEASE_RUN) == release_run:
        return None  # the release that created it, finishing it
    if state in (STOPPED, AWAITING_APPROVAL) and alias == "candidate":
        return None
    why = _WHY.get(state or "", "relctl does not know this state")
    return f"{alias} may not point at v{version}: it is {state} ({why})"


def approval_refusal(tags: Mapping[str, str]) -> str | None:
    """Why a version with `tags` may not be approved; None: it passed its gates and waits for an approval
    (or was approved by an approve that died before production moved, which a second approve finishes)."""
    state = tags.get(T.RELEASE_STATE)
    if state in (AWAITING_APPROVAL, APPROVED):
        return None
    return f"it is {state or 'untracked'} ({_NOT_APPROVABLE.get(state, 'relctl does not know this state')})"
