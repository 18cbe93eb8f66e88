"""Alias moves of one model are serialized with a lease held in the registry itself.

MLflow has no compare-and-set on tags, but creating a registered model is atomic (the name is unique
in every backend: SQLite, PostgreSQL, MySQL, a tracking server in front of any of them). So the lease
for model M is a registered model named `relctl.lock.M` that exists while some process holds it; its
tags say who (user, host, pid) and until when. This works across processes and, through a tracking
server, across machines, with nothing but the registry. A holder that died leaves a lease that
expires (`RELCTL_LOCK_TTL_S`, default 120 s; a lease of a dead pid on this host is broken at once).
Breaking a stale lease is itself serialized by creating `relctl.lock.M.break.<nonce>` first, so two
breakers cannot both delete a lease and a fresh one taken in between.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psutil
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from release.errors import RegistryError

LOCK_PREFIX = "relctl.lock."
DEFAULT_TTL_S = 120.0
DEFAULT_WAIT_S = 180.0


def is_lock_model(name: str) -> bool:
    return name.startswith(LOCK_PREFIX)


def _exists_error(exc: MlflowException) -> bool:
    return exc.error_code == "RESOURCE_ALREADY_EXISTS" or "already exists" in str(exc.message).lower()


def _busy_error(exc: MlflowException) -> bool:
    # SQLite under concurrent writers: contention, not failure.
    return "database is locked" in str(exc.message).lower()


def _missing_error(exc: MlflowException) -> bool:
    return exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


def _ttl() -> float:
    return float(os.environ.get("RELCTL_LOCK_TTL_S", DEFAULT_TTL_S))


@contextmanager
def model_lock(client: MlflowClient, model: str, purpose: str, wait_s: float = DEFAULT_WAIT_S) -> Iterator[None]:
    """Hold the alias-move lease of `model` for the duration of the block."""
    name = f"{LOCK_PREFIX}{model}"
    nonce = secrets.token_hex(8)
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while True:
        expires = time.time() + _ttl()
        tags = {"nonce": nonce, "host": socket.gethostname(), "pid": str(os.getpid()),
                "purpose": purpose, "expires": f"{expires:.3f}",
                "since": datetime.now(UTC).isoformat(timespec="seconds")}
        try:
            client.create_registered_model(name, tags=tags, description=f"relctl: {purpose} of '{model}' in progress")
            break
        except MlflowException as exc:
            # MLflow's SQL store answers a duplicate name by reading the model back; when the holder
            # released it in between (PostgreSQL behind a tracking server) that read says "not found".
            if not (_exists_error(exc) or _busy_error(exc) or _missing_error(exc)):
                raise RegistryError(f"cannot take the alias lock of '{model}': {exc.message}") from exc
        holder = _holder(client, name)
        if holder is not None and holder.get("nonce") == nonce:
            break  # our own create went through and MLflow's retry of it (after a lost answer) collided
        if holder is not None and _stale(holder):
            _break(client, name, holder)
            continue
        if time.monotonic() > deadline:
            who = f"{holder.get('purpose')} by pid {holder.get('pid')} on {holder.get('host')}" if holder else "?"
            raise RegistryError(f"'{model}' is locked ({who}, since {holder.get('since') if holder else '?'})",
                                hint="another relctl is moving its aliases; retry when it is done "
                                     "(a dead holder's lease expires by itself)")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    try:
        yield
    finally:
        current = _holder(client, name)
        if current is not None and current.get("nonce") == nonce:
            _delete(client, name)


def _holder(client: MlflowClient, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.get_registered_model(name).tags)
    except MlflowException as exc:
        if _missing_error(exc) or exc.error_code == "INVALID_PARAMETER_VALUE":
            return None
        raise RegistryError(f"cannot read lock '{name}': {exc.message}") from exc


def _stale(holder: dict[str, Any]) -> bool:
    try:
        if float(holder.get("expires", "0")) < time.time():
            return True
        if holder.get("host") == socket.gethostname():
            return not psutil.pid_exists(int(holder.get("pid", "0")))
    except ValueError:
        return True
    return False


def _break(client: MlflowClient, name: str, holder: dict[str, Any]) -> None:
    marker = f"{name}.break.{holder.get('nonce')}"
    try:
        client.create_registered_model(marker, description="relctl: breaking a stale lock")
    except MlflowException as exc:
        if _exists_error(exc):
            time.sleep(0.05)  # someone else is breaking it
            return
        raise RegistryError(f"cannot break stale lock '{name}': {exc.message}") from exc
    try:
        again = _holder(client, name)
        if again is not None and again.get("nonce") == holder.get("nonce"):
            _delete(client, name)
    finally:
        _delete(client, marker)


def _delete(client: MlflowClient, name: str) -> None:
    try:
        client.delete_registered_model(name)
    except MlflowException as exc:
        if not _missing_error(exc):
            raise RegistryError(f"cannot release lock '{name}': {exc.message}") from exc
