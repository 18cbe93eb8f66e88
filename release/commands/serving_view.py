"""What `relctl status` says about serving: base <-> adapters, and the running servers.

For a base model: the production version of every adapter built for one of its versions (one tag search,
then one alias read per adapter), by the base version it was built for; for an adapter: the base version
each of its aliased versions was built for and that base's production. For both: the servers that recorded
themselves on the base's registered model (release/registry/servers.py), each with what it serves that is
not production (an older base, an adapter version production has left, an adapter it does not serve) and
whether its heartbeat is stale (then nothing it says is taken as serving).

Tags answer here (a read for people, seconds); every serving and release decision reads the signed package.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from release.adapters.trust import KIND
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.records import ModelRecord, VersionRecord
from release.registry.servers import ServerRecord, servers_of


def adapter_productions(registry: Registry, base_model: str) -> dict[str, VersionRecord]:
    """The production version of every adapter with a version built for `base_model` (any version of it)."""
    found = {}
    for name in registry.models_tagged({T.KIND: KIND, T.BASE_MODEL: base_model}):
        mv = registry.version_for(name, PRODUCTION)
        if mv is not None and mv.tags.get(T.KIND) == KIND and mv.tags.get(T.BASE_MODEL) == base_model:
            found[name] = mv
    return found


def base_view(registry: Registry, record: ModelRecord) -> dict[str, Any]:
    """Status of a base model: its production adapters by base version, and its servers."""
    productions = adapter_productions(registry, record.name)
    adapters = [{"model": name, "version": str(mv.version), "base_version": mv.tags.get(T.BASE_VERSION)}
                for name, mv in sorted(productions.items())]
    production = record.aliases.get(PRODUCTION)
    servers = [server_view(s, production, productions) for s in servers_of(dict(record.tags))]
    return {"adapters": adapters, "servers": servers}


def adapter_view(registry: Registry, aliased: dict[str, VersionRecord]) -> dict[str, Any]:
    """Status of an adapter: the base each aliased version was built for, the base's production, and the
    servers of that base that serve (or hold back) this adapter."""
    production = aliased.get(PRODUCTION) or next(iter(aliased.values()), None)
    base_model = production.tags.get(T.BASE_MODEL) if production is not None else None
    built_for = {alias: mv.tags.get(T.BASE_VERSION) for alias, mv in aliased.items()}
    if not base_model or not registry.model_exists(base_model):
        return {"base": {"model": base_model, "production": None, "built_for": built_for}, "servers": []}
    base = registry.read_model(base_model)
    name = production.name if production is not None else ""
    mine = {name: aliased[PRODUCTION]} if PRODUCTION in aliased else {}
    servers = [server_view(s, base.aliases.get(PRODUCTION), mine) for s in servers_of(dict(base.tags))
               if name in s.adapters or name in s.held]
    return {"base": {"model": base_model, "production": base.aliases.get(PRODUCTION), "built_for": built_for},
            "servers": servers}


def server_view(server: ServerRecord, base_production: str | None, productions: dict[str, VersionRecord],
                now: datetime | None = None) -> dict[str, Any]:
    """One server's record, with what it serves other than production (`differs`) and whether it is stale."""
    now = now or datetime.now(UTC)
    differs = []
    if base_production is not None and server.base_version != base_production:
        differs.append(f"runs {server.base_model} v{server.base_version}; production is v{base_production}")
    for name, mv in sorted(productions.items()):
        served = server.adapters.get(name)
        if mv.tags.get(T.BASE_VERSION) != server.base_version:
            if served is not None:
                differs.append(f"serves {name} v{served}; production v{mv.version} is built for "
                               f"{server.base_model} v{mv.tags.get(T.BASE_VERSION)}")
        elif served is None:
            differs.append(f"does not serve {name} (production v{mv.version})")
        elif served != str(mv.version):
            differs.append(f"serves {name} v{served}; production is v{mv.version}")
    age = server.age_s(now)
    return {"id": server.id, "url": server.url, "host": server.host, "pid": server.pid,
            "base": {"model": server.base_model, "version": server.base_version}, "adapters": dict(server.adapters),
            "held": dict(server.held), "follows": server.follows, "interval_s": server.interval_s,
            "heartbeat_s": server.heartbeat_s, "started": server.started, "last_seen": server.last_seen,
            "age_s": None if age is None else round(age, 1), "stale": server.stale(now),
            "serves_production": not differs, "differs": differs}


def adapter_lines(status: dict[str, Any]) -> list[str]:
    """Base <-> adapters for the text output: a base's production adapters by the version they were built for
    (those built for a version production has left: stranded), or the base an adapter's versions were built for."""
    model = status["model"]
    if "adapter_of" in status:
        base = status["adapter_of"]
        lines = [f"{model}@{alias}: built for {base['model']} v{version}"
                 for alias, version in sorted(base["built_for"].items())]
        built = base["built_for"].get(PRODUCTION)
        if base["production"] is not None and built is not None and built != base["production"]:
            lines.append(f"{model}: its production is built for {base['model']} v{built}, but {base['model']}'s "
                         f"production is v{base['production']}: no production base serves it")
        return lines
    production = status["aliases"].get(PRODUCTION, {}).get("version")
    by_version: dict[str, list[str]] = {}
    for a in status.get("adapters", []):
        by_version.setdefault(str(a["base_version"]), []).append(f"{a['model']} v{a['version']}")
    lines = []
    for version, names in sorted(by_version.items()):
        stranded = "" if version == production else " (stranded: not the production version)"
        lines.append(f"{model} v{version} production adapters: {', '.join(names)}{stranded}")
    return lines


def server_lines(servers: list[dict[str, Any]]) -> list[str]:
    """The servers, one line each (and one per version it serves other than production), for the text output."""
    lines = []
    for s in servers:
        served = ", ".join(f"{m} v{v}" for m, v in sorted(s["adapters"].items())) or "no adapter"
        seen = "never" if s["age_s"] is None else f"{s['age_s']:.0f}s ago"
        head = (f"server {s['url']} (host {s['host']}, pid {s['pid']}): {s['base']['model']} v{s['base']['version']} "
                f"with {served}; last seen {seen}")
        if s["stale"]:
            lines.append(f"{head}: STALE (its heartbeat is every {s['heartbeat_s']:g}s; stopped or cut off from the "
                         "registry: what it says may no longer hold)")
        else:
            follows = f"follows the registry every {s['interval_s']:g}s" if s["follows"] else "does not follow"
            lines.append(f"{head}; {follows}")
        lines += [f"  not production: {d}" for d in s["differs"]]
        lines += [f"  held back: {m}: {why}" for m, why in sorted(s["held"].items())]
    return lines
