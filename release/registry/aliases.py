"""Alias moves with a history that survives crashes: intent first, then the move, then the confirmation.

MLflow keeps no alias history, so relctl records each move as a registered-model tag
`relctl.history.<utc>.<nonce>` holding JSON. A move is written as `pending` before any alias changes and
rewritten as `done` after; a process that dies in between leaves a pending entry, and the next command
that touches the model's aliases repairs it from the registry's state (under the model's lock):
every alias already at its target -> `done`; none moved -> `abandoned` (the move never happened, and
history ignores it); some moved -> the rest are moved too (the decision had been made) -> `repaired`.
"""

from __future__ import annotations

import getpass
import json
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from release.core.errors import RegistryError
from release.core.faults import pause_point
from release.registry import tags as T

MoveState = Literal["pending", "done", "repaired", "abandoned"]
Changes = dict[str, list[str | None]]


@dataclass(frozen=True)
class AliasMove:
    """One release event: every alias it changed, as {alias: [from_version, to_version]}."""

    at: str
    action: str
    changes: Changes
    reason: str
    release_run: str | None = None
    user: str = field(default_factory=lambda: _user())
    state: MoveState = "done"
    key: str = ""

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("key")
        return json.dumps(data, sort_keys=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers; the move is still worth recording
        return "unknown"


def _new_key(at: str) -> str:
    return f"{T.HISTORY_PREFIX}{at.replace(':', '').replace('+0000', 'Z')}.{secrets.token_hex(3)}"


def read_history(client: MlflowClient, name: str, include_abandoned: bool = False) -> list[AliasMove]:
    """Every recorded move of `name`, oldest first (by the key's UTC timestamp)."""
    return history_from_tags(client.get_registered_model(name).tags, include_abandoned)


def has_pending(tags: dict[str, str]) -> bool:
    """Whether the registered model's tags hold a move a dead process left half-done."""
    return any(m.state == "pending" for m in history_from_tags(tags, include_abandoned=True))


def history_from_tags(tags: dict[str, str], include_abandoned: bool = False) -> list[AliasMove]:
    """The moves recorded in a registered model's tags (already read: a reader needs no second query)."""
    moves = []
    for key in sorted(k for k in tags if k.startswith(T.HISTORY_PREFIX)):
        data: dict[str, Any] = json.loads(tags[key])
        move = AliasMove(**data, key=key)
        if include_abandoned or move.state != "abandoned":
            moves.append(move)
    return moves


def _write(client: MlflowClient, name: str, move: AliasMove) -> None:
    client.set_registered_model_tag(name, move.key, move.to_json())


def _apply(client: MlflowClient, name: str, changes: Changes, current: dict[str, str]) -> None:
    for alias, (_, to) in changes.items():
        if to is None:
            if alias in current:
                client.delete_registered_model_alias(name, alias)
        elif current.get(alias) != to:
            client.set_registered_model_alias(name, alias, to)


def apply_move(
    client: MlflowClient, name: str, current: dict[str, str], wanted: dict[str, str | None], action: str,
    reason: str, release_run: str | None, user: str | None = None,
) -> AliasMove | None:
    """Move the aliases in `wanted` (None deletes), recording intent and confirmation; None if nothing changes.

    The caller holds the model's lock and passes the aliases it read under it. `user`: who the history names
    (an approval names its approver); default the login name.
    """
    changes: Changes = {a: [current.get(a), to] for a, to in wanted.items() if current.get(a) != to}
    if not changes:
        return None
    at = datetime.now(UTC).isoformat(timespec="milliseconds")
    move = AliasMove(at=at, action=action, changes=changes, reason=reason, release_run=release_run,
                     user=user or _user(), state="pending", key=_new_key(at))
    try:
        _write(client, name, move)
        pause_point("alias-move:intent-recorded")
        _apply(client, name, changes, current)
        pause_point("alias-move:aliases-moved")
        done = replace(move, state="done")
        _write(client, name, done)
    except MlflowException as exc:
        raise RegistryError(f"cannot move aliases of '{name}': {exc.message}",
                            hint="the next relctl command on this model repairs a half-done move") from exc
    return done


def record_event(client: MlflowClient, name: str, action: str, reason: str, release_run: str | None) -> AliasMove:
    """A history entry that moved no alias (e.g. `re-gated`: new evidence recorded on the serving version)."""
    at = datetime.now(UTC).isoformat(timespec="milliseconds")
    move = AliasMove(at=at, action=action, changes={}, reason=reason, release_run=release_run, key=_new_key(at))
    _write(client, name, move)
    return move


def repair_pending(client: MlflowClient, name: str, aliases: Callable[[], dict[str, str]]) -> list[str]:
    """Finish or abandon the pending moves a dead process left; one line per repair, for the user."""
    notes = []
    for move in read_history(client, name, include_abandoned=True):
        if move.state != "pending":
            continue
        current = aliases()
        at_target = [a for a, (_, to) in move.changes.items() if current.get(a) == to]
        if len(at_target) == len(move.changes):
            fixed, what = replace(move, state="done"), "had completed; confirmed it"
        elif not at_target:
            fixed, what = replace(move, state="abandoned"), "never moved an alias; recorded it as abandoned"
        else:
            _apply(client, name, move.changes, current)
            fixed, what = replace(move, state="repaired"), f"had moved only {', '.join(at_target)}; finished it"
        _write(client, name, fixed)
        notes.append(f"{name}: an interrupted {move.action} ({move.at}, {_describe(move.changes)}) {what}")
    return notes


def _describe(changes: Changes) -> str:
    return ", ".join(f"{a} {f or '-'} -> {t or '-'}" for a, (f, t) in sorted(changes.items()))
