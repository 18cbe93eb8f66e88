"""Running base servers record themselves in the registry, so `relctl status` can say who serves what.

A `relctl serve BASE --adapters` process writes one tag on its base's registered model,
`relctl.server.<id>`, holding JSON: which server (id, URL, host, pid), the base version it runs, the adapter
versions it serves (served name -> version), the versions it does not serve although they are production and
why (`held`), whether it follows the registry and how often, when it started and when it was last seen.
It rewrites the tag at every heartbeat and removes it when it stops; a server that died leaves a record
whose heartbeat grows old, which status marks stale (older than STALE_BEATS heartbeats) and never trusts
as serving.

The base's registered model holds them because that is what status reads anyway (one read of the model
gives its aliases, its history and its servers). These records are what the servers say about themselves:
evidence for people reading status, never an input to a release decision.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from release.registry import tags as T

if TYPE_CHECKING:
    from release.registry.client import Registry

SCHEMA = 1
STALE_BEATS = 3          # a record not rewritten for this many heartbeats is stale
STALE_GRACE_S = 5.0      # plus this much: a busy registry delays a write
HELD_MAX = 300           # characters of one reason, so the record stays within a tag's 5000


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_server_id() -> str:
    """This process's id in the registry: host, pid and a nonce (a pid is reused after a restart)."""
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname())[:64] or "host"
    return f"{host}.{os.getpid()}.{secrets.token_hex(3)}"


@dataclass(frozen=True)
class ServerRecord:
    id: str
    url: str
    host: str
    pid: int
    base_model: str
    base_version: str
    adapters: dict[str, str] = field(default_factory=dict)    # served name -> version
    held: dict[str, str] = field(default_factory=dict)        # adapter -> why its production is not served
    follows: bool = True                                       # switches to production moves by itself
    interval_s: float = 10.0                                   # how often it reads the registry
    heartbeat_s: float = 10.0                                  # how often it rewrites this record
    started: str = ""
    last_seen: str = ""
    schema: int = SCHEMA

    @property
    def tag(self) -> str:
        return T.SERVER_PREFIX + self.id

    def to_json(self) -> str:
        held = {k: v[:HELD_MAX] for k, v in self.held.items()}
        return json.dumps({**asdict(self), "held": held}, sort_keys=True)

    def age_s(self, now: datetime | None = None) -> float | None:
        """Seconds since the server last wrote its record; None when it cannot be read."""
        try:
            seen = datetime.fromisoformat(self.last_seen)
        except ValueError:
            return None
        return ((now or datetime.now(UTC)) - seen).total_seconds()

    def stale(self, now: datetime | None = None) -> bool:
        """Not rewritten for STALE_BEATS heartbeats: the server died, hangs or lost the registry."""
        age = self.age_s(now)
        return age is None or age > STALE_BEATS * max(self.heartbeat_s, 1.0) + STALE_GRACE_S

    def seen_now(self, **changes: Any) -> ServerRecord:
        return replace(self, last_seen=now_iso(), **changes)


def parse_record(value: str) -> ServerRecord | None:
    """A record from its tag's JSON; None for one that is not a record this relctl can read."""
    try:
        data = json.loads(value)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            return None
        known = {k: data[k] for k in ServerRecord.__dataclass_fields__ if k in data}
        record = ServerRecord(**known)
        if not isinstance(record.adapters, dict) or not isinstance(record.held, dict):
            return None
        return record
    except (ValueError, TypeError):
        return None


def servers_of(model_tags: dict[str, str]) -> list[ServerRecord]:
    """The server records among a registered model's tags (a read of the model: no further query), newest
    heartbeat first."""
    found = [parse_record(v) for k, v in model_tags.items() if k.startswith(T.SERVER_PREFIX)]
    return sorted((r for r in found if r is not None), key=lambda r: r.last_seen, reverse=True)


def record_server(registry: Registry, record: ServerRecord) -> None:
    """Write (or rewrite: the heartbeat) `record` on its base's registered model."""
    registry.set_model_tag(record.base_model, record.tag, record.to_json())


def drop_server(registry: Registry, record: ServerRecord) -> None:
    """Remove `record` (the server stops)."""
    registry.delete_model_tag(record.base_model, record.tag)
