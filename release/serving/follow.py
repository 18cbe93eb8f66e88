"""`relctl serve BASE --adapters` follows the registry: the running server is never behind it for long.

A background thread reads the registry every `interval_s` (serve --follow-interval, default 10 s): the
production alias of every adapter with a version built for this base version (one tag search, then one alias
read per adapter) and of every adapter it serves. When an adapter's production moved since the last read (promote
--onto, rollback, approve, a passed canary), it switches to the new version through the adapter table (the
same load-then-point-then-unload switch as POST /admin/adapters, verified the same way); a newly released
adapter of this base is loaded the same way. It follows moves, not a state: an admin switch to another
version stays until production moves again.

Not switched to, and said in the log and in the server's registry record (`held`): a production version built
for another base version (its tags say so, so nothing is downloaded; a tag that lies the other way is caught
by the switch's own check of the signed package), and one the switch refuses (its signed package names
another base, its signature, its state). A refusal is not retried until production moves again; a failure
of the registry or the download is retried at the next read.

Every read ends with the server's record rewritten (release/registry/servers.py): `relctl status` shows it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from release.adapters.trust import KIND as ADAPTER_KIND
from release.core.errors import InputError
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.servers import ServerRecord, drop_server, new_server_id, now_iso, record_server

DEFAULT_INTERVAL_S = 10.0
HEARTBEAT_FLOOR_S = 10.0   # a server that reads more often still writes its record at most this often

log = logging.getLogger("relctl.serve")


class Table(Protocol):
    """What the follower needs of the server's adapter table (release/serving/adapters.py: its switch is
    thread-safe, so the follower's thread and an admin request may switch at once)."""

    def listing(self) -> list[Any]: ...

    def switch(self, model: str, version: str | None) -> tuple[Any, Any]: ...


class Follower:
    """The server's watch on its adapters' production aliases, and its record in the registry."""

    def __init__(self, registry: Registry, table: Table, base_model: str, base_version: str,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.registry = registry
        self.table = table
        self.base = (base_model, base_version)
        self.follow = interval_s > 0  # 0: switch only by admin request, still record itself
        self.interval_s = interval_s if self.follow else DEFAULT_INTERVAL_S
        self.heartbeat_s = max(self.interval_s, HEARTBEAT_FLOOR_S)
        # The production version last acted on per adapter: a move is a change of it.
        self.seen: dict[str, str] = {a.model: a.version for a in table.listing() if not a.pinned}
        self.held: dict[str, str] = {}
        self.record: ServerRecord | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._written_at = 0.0

    # --- the process's life ---------------------------------------------------------------------
    def start(self, url: str, host: str, pid: int) -> None:
        """Record this server, then read the registry every interval on a daemon thread."""
        started = now_iso()
        self.record = ServerRecord(id=new_server_id(), url=url, host=host, pid=pid, base_model=self.base[0],
                                   base_version=self.base[1], follows=self.follow, interval_s=self.interval_s,
                                   heartbeat_s=self.heartbeat_s, started=started, last_seen=started)
        self._write(force=True)
        what = f"every {self.interval_s:g}s" if self.follow else "only to record itself (--follow-interval 0)"
        log.info("following the registry: %s v%s's adapters, %s", *self.base, what)
        self._thread = threading.Thread(target=self._loop, name="relctl-follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading and remove this server's record (a clean stop; a crash leaves it to go stale)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30)
        if self.record is not None:
            try:
                drop_server(self.registry, self.record)
            except Exception as exc:  # a registry that is down now: the record goes stale instead
                log.warning("could not remove this server's registry record: %s", exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:  # the registry down, a bug: the server keeps serving, the next read retries
                log.warning("reading the registry failed (retrying in %gs): %s", self.interval_s, exc)

    # --- one read ---------------------------------------------------------------------------------
    def poll(self) -> list[str]:
        """One read of the registry: switch what moved, record this server; what it did, one line each."""
        done: list[str] = []
        if self.follow:
            for name in self._adapters():
                line = self._follow(name)
                if line:
                    done.append(line)
        self._write(force=bool(done))
        return done

    def _adapters(self) -> list[str]:
        # Adapters with a version built for this base version (one tag search): a new one released onto it,
        # and those whose production moved on (to another base version too: held, said why).
        built = self.registry.models_tagged({T.KIND: ADAPTER_KIND, T.BASE_MODEL: self.base[0],
                                             T.BASE_VERSION: self.base[1]})
        served = {a.model for a in self.table.listing() if not a.pinned}
        return sorted(set(built) | served)

    def _served(self, name: str) -> str | None:
        return next((a.version for a in self.table.listing() if a.model == name and not a.pinned), None)

    def _follow(self, name: str) -> str | None:
        mv = self.registry.version_for(name, PRODUCTION)
        if mv is None or self.seen.get(name) == str(mv.version):
            return None
        version, served = str(mv.version), self._served(name)
        if served == version:
            self.seen[name] = version
            self.held.pop(name, None)
            return None
        built = (mv.tags.get(T.BASE_MODEL), mv.tags.get(T.BASE_VERSION))
        if mv.tags.get(T.KIND) != ADAPTER_KIND or built != self.base:
            self.seen[name] = version
            if served is None:
                return None  # an adapter of another version of this base: not this server's
            return self._hold(name, f"production is v{version}, built for {built[0]} v{built[1]}; this server runs "
                                    f"{self.base[0]} v{self.base[1]}, so it keeps serving v{served}")
        try:
            self.table.switch(name, version)
        except InputError as exc:  # refused: its signed package, its signature, its state; not retried
            self.seen[name] = version
            keeps = f"; it keeps serving v{served}" if served else ""
            return self._hold(name, f"production v{version} is not served: {exc.message}{keeps}")
        except Exception as exc:  # the registry or the download failed: retried at the next read
            log.warning("could not switch %s to its production v%s (retrying in %gs): %s", name, version,
                        self.interval_s, exc)
            return None
        self.seen[name] = version
        self.held.pop(name, None)
        line = (f"followed the registry: {name} v{served} -> v{version} (production moved)" if served
                else f"followed the registry: {name} v{version} loaded (released onto this base)")
        log.info(line)
        return line

    def _hold(self, name: str, why: str) -> str:
        self.held[name] = why
        line = f"not switching {name}: {why}"
        log.warning(line)
        return line

    def _write(self, force: bool) -> None:
        """The record, rewritten at every heartbeat and whenever what is served changed."""
        if self.record is None:
            return
        now = time.monotonic()
        if not force and now - self._written_at < self.heartbeat_s:
            return
        served = {a.served_name: a.version for a in self.table.listing()}
        self.record = self.record.seen_now(adapters=served, held=dict(self.held))
        record_server(self.registry, self.record)
        self._written_at = now
