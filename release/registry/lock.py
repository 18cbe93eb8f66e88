"""Alias moves of one model are serialized with a lease held in the registry itself.

MLflow has no compare-and-set on tags, but creating a registered model is atomic (the name is unique
in every backend: SQLite, PostgreSQL, MySQL, a tracking server in front of any of them). So the lease
for model M is a registered model named `relctl.lock.M` that exists while some process holds it; its
tags say who (user, host, pid) and until when. This works across processes and, through a tracking
server, across machines, with nothing but the registry. A holder that died leaves a lease that
expires (`RELCTL_LOCK_TTL_S`, default 120 s; a lease of a dead pid on this host is broken at once).
Breaking a stale lease is itself serialized by creating `relctl.lock.M.break.<nonce>` first, so two
breakers cannot both delete a lease and a fresh one taken in between.

The `relctl.lock.` namespace is reserved: relctl never registers a model named so, and it treats a
registered model there as a lease only when it carries the lease marker tag (`relctl.lease`) that
relctl writes in the same atomic create. Anything else under that name (a model someone registered
directly in MLflow) is never hidden, never broken, never deleted: the alias move stops with exit 4
naming it. Every wait has a deadline (`RELCTL_LOCK_WAIT_S`, default 180 s) and ends in exit 4 naming
the holder, whatever is in the way (a live holder, a leftover break marker, a name that is not a lease).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psutil
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from release.core.errors import RegistryError
from release.core.model_name import LOCK_PREFIX

TAGLESS_GRACE_S = 1.0
LEASE_TAG = "relctl.lease"          # the marker: only a model carrying it is a lease relctl may break
LEASE_KIND = "lease"
BREAK_KIND = "break"
DEFAULT_TTL_S = 120.0
DEFAULT_WAIT_S = 180.0
BUSY_RETRY_S = 30.0
T = TypeVar("T")


def is_lease(tags: dict[str, str]) -> bool:
    """A registered model's tags prove it is one of relctl's leases (or break markers)."""
    return tags.get(LEASE_TAG) in (LEASE_KIND, BREAK_KIND)


def _exists_error(exc: MlflowException) -> bool:
    return exc.error_code == "RESOURCE_ALREADY_EXISTS" or "already exists" in str(exc.message).lower()


def is_busy(exc: BaseException) -> bool:
    # SQLite under concurrent writers: contention, not failure.
    return "database is locked" in str(getattr(exc, "message", exc)).lower()


def _busy_error(exc: MlflowException) -> bool:
    return is_busy(exc)


def _missing_error(exc: MlflowException) -> bool:
    return exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


def _ttl() -> float:
    return float(os.environ.get("RELCTL_LOCK_TTL_S", DEFAULT_TTL_S))


def wait_s() -> float:
    """How long an alias move waits for the lease before exit 4 (`RELCTL_LOCK_WAIT_S`, default 180 s)."""
    return float(os.environ.get("RELCTL_LOCK_WAIT_S", DEFAULT_WAIT_S))


def retry_busy(action: Callable[[], T], budget_s: float = BUSY_RETRY_S) -> T:
    """`action()`, retried while SQLite answers "database is locked" (another writer), up to `budget_s`."""
    deadline = time.monotonic() + budget_s
    delay = 0.05
    while True:
        try:
            return action()
        except Exception as exc:  # MlflowException, RegistryError or SQLAlchemy's OperationalError
            if not is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def _owner_tags(kind: str, nonce: str, purpose: str) -> dict[str, str]:
    return {LEASE_TAG: kind, "nonce": nonce, "host": socket.gethostname(), "pid": str(os.getpid()),
            "purpose": purpose, "expires": f"{time.time() + _ttl():.3f}",
            "since": datetime.now(UTC).isoformat(timespec="seconds")}


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "holder unknown"
    return (f"{holder.get('purpose', '?')} by pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"since {holder.get('since', '?')}")


@contextmanager
def model_lock(client: MlflowClient, model: str, purpose: str, wait: float | None = None) -> Iterator[None]:
    """Hold the alias-move lease of `model` for the duration of the block."""
    name = f"{LOCK_PREFIX}{model}"
    nonce = secrets.token_hex(8)
    budget = wait_s() if wait is None else wait
    deadline = time.monotonic() + budget
    delay = 0.02
    tagless_since: float | None = None
    while True:
        try:
            client.create_registered_model(name, tags=_owner_tags(LEASE_KIND, nonce, purpose),
                                           description=f"relctl: {purpose} of '{model}' in progress")
            break
        except MlflowException as exc:
            # MLflow's SQL store answers a duplicate name by reading the model back; when the holder
            # released it in between (PostgreSQL behind a tracking server) that read says "not found".
            if not (_exists_error(exc) or _busy_error(exc) or _missing_error(exc)):
                raise RegistryError(f"cannot take the alias lock of '{model}': {exc.message}") from exc
        holder = _holder(client, name)
        if holder is not None and holder.get("nonce") == nonce:
            break  # our own create went through and MLflow's retry of it (after a lost answer) collided
        blocker = ""
        # Through a tracking server another relctl's lease can be read between its create and its tags (or
        # its tags' removal and its delete): a tagless holder is judged only once it stays tagless for a second.
        tagless = holder is not None and not holder
        tagless_since = (tagless_since or time.monotonic()) if tagless else None
        if holder is not None and not is_lease(holder) and (
                not tagless or time.monotonic() - (tagless_since or 0.0) > TAGLESS_GRACE_S):
            _not_a_lease(model, name, holder)
            blocker = (f"; it carries no {LEASE_TAG} tag (an older relctl's lease?), so relctl never breaks it: "
                       f"delete '{name}' in MLflow if its holder is gone")
        elif holder is not None and _stale(holder):
            blocker = _break(client, name, holder)
        # Checked on every pass, whatever is in the way: no wait is without an end.
        if time.monotonic() > deadline:
            raise RegistryError(
                f"'{model}' is locked ({describe(holder)}); gave up after {budget:g} s{blocker}",
                hint="another relctl is moving its aliases; retry when it is done (a dead holder's lease "
                     "expires by itself; RELCTL_LOCK_WAIT_S sets the wait)")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    try:
        yield
    finally:
        current = _holder(client, name)
        if current is not None and current.get("nonce") == nonce:
            _delete(client, name)


def _not_a_lease(model: str, name: str, tags: dict[str, Any]) -> None:
    """The lease's name is taken by a model relctl cannot prove is its lease: never delete it, say so."""
    if "nonce" in tags and "expires" in tags:
        return  # an older relctl's lease (no marker): waited for, never broken, until the deadline
    raise RegistryError(f"registered model '{name}' blocks the alias lease of '{model}': it is not a relctl "
                        f"lease (no {LEASE_TAG} tag), so relctl will not delete it",
                        hint=f"rename or delete '{name}' in MLflow; names starting with '{LOCK_PREFIX}' are "
                             "reserved for relctl's leases")


def _holder(client: MlflowClient, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.get_registered_model(name).tags)
    except MlflowException as exc:
        if _missing_error(exc) or exc.error_code == "INVALID_PARAMETER_VALUE":
            return None
        if _busy_error(exc):
            return None  # unknown for now: the caller waits and asks again
        raise RegistryError(f"cannot read lock '{name}': {exc.message}") from exc


def _stale(holder: dict[str, Any]) -> bool:
    """Expired, or held by a dead process on this host. Only ever asked of a proven lease."""
    try:
        if float(holder.get("expires", "0")) < time.time():
            return True
        if holder.get("host") == socket.gethostname():
            return not psutil.pid_exists(int(holder.get("pid", "0")))
    except ValueError:
        return True
    return False


def _break(client: MlflowClient, name: str, holder: dict[str, Any]) -> str:
    """Delete the stale lease `holder` under a break marker; '' or why it could not (for the timeout message)."""
    marker = f"{name}.break.{holder.get('nonce')}"
    nonce = secrets.token_hex(8)
    try:
        client.create_registered_model(marker, tags=_owner_tags(BREAK_KIND, nonce, f"breaking {name}"),
                                       description="relctl: breaking a stale lock")
    except MlflowException as exc:
        if not (_exists_error(exc) or _busy_error(exc)):
            raise RegistryError(f"cannot break stale lock '{name}': {exc.message}") from exc
        # Someone is breaking it, or a breaker died and left its marker: a marker of ours that is itself
        # stale is removed (it only ever guarded a delete that takes milliseconds); anything else waits.
        left = _holder(client, marker)
        if left is not None and is_lease(left) and left.get(LEASE_TAG) == BREAK_KIND and _stale(left):
            again = _holder(client, marker)
            if again is not None and again.get("nonce") == left.get("nonce"):
                _delete(client, marker)
            return ""
        if left is not None:
            owner = describe(left) if is_lease(left) else f"not provably relctl's: no {LEASE_TAG} tag"
            return f"; the stale lease's break marker '{marker}' ({owner}) is in the way: delete it in MLflow"
        return ""
    try:
        again = _holder(client, name)
        if again is not None and again.get("nonce") == holder.get("nonce") and is_lease(again):
            _delete(client, name)
    finally:
        _delete(client, marker)
    return ""


def _delete(client: MlflowClient, name: str) -> None:
    try:
        retry_busy(lambda: client.delete_registered_model(name))
    except MlflowException as exc:
        if not _missing_error(exc):
            raise RegistryError(f"cannot release lock '{name}': {exc.message}") from exc
