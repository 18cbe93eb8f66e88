"""Benchmark: what one read of the registry costs a server that follows it (`relctl serve --adapters`,
release/serving/follow.py), against the read the server already makes at start.

    Follower.poll()          one tag search for the base's adapters, one production-alias read per adapter
                             (and per adapter it serves), the record rewritten (a heartbeat)
    production_adapters()    the baseline: what serve --adapters reads at start and rollback BASE's
                             stranding check reads (one tag search, one alias read per adapter)

On an embedded SQLite store in a temporary project, with K adapters built for the base, every one served at
its production version (nothing switches: the steady state, what the server pays every interval). Both run
in this one warm interpreter, alternating within each round, so a busy moment falls on both; medians over
--rounds go to benchmarks/results/follow_poll.json.

    python benchmarks/follow_poll.py [--adapters 1 4 16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = Path(__file__).parent / "results" / "follow_poll.json"
BASE = "tiny-llm"


@dataclass(frozen=True)
class Entry:
    model: str
    version: str
    pinned: bool = False

    @property
    def served_name(self) -> str:
        return self.model


class Steady:
    """A server's adapter table in the steady state: every adapter at its production version (no switch)."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries

    def listing(self) -> list[Entry]:
        return list(self.entries)

    def switch(self, model: str, version: str | None) -> tuple[Any, Any]:
        raise AssertionError(f"the steady state switches nothing ({model} v{version})")


def project_with(adapters: int, root: Path) -> tuple[Any, list[Entry]]:
    """A project whose base v1 has `adapters` adapters built for it, each production at v1 (tags only)."""
    from release.registry import Registry
    from release.registry.store import connect, resolve_store
    from tests.adapters.test_base_match import adapter_version, base_version

    project = root / f"p{adapters}"
    project.mkdir()
    digest = "sha256:" + "11" * 32
    version = base_version(project, digest)
    names = [f"{BASE}-a{i}" for i in range(adapters)]
    for name in names:
        adapter_version(project, name, version, digest)
    store = resolve_store(project)
    connect(store)
    return Registry(store), [Entry(name, "1") for name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from release.adapters.trust import production_adapters
    from release.serving.follow import Follower

    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="follow-poll-") as tmp:
        for count in args.adapters:
            registry, entries = project_with(count, Path(tmp))
            follower = Follower(registry, Steady(entries), BASE, "1", interval_s=10.0)
            follower.start("http://127.0.0.1:0", "bench", os.getpid())  # its first record; the thread waits 10 s
            polls, baseline = [], []
            for _ in range(args.rounds):
                started = time.perf_counter()
                assert follower.poll() == []
                polls.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert len(production_adapters(registry, BASE, "1")) == count
                baseline.append(time.perf_counter() - started)
            follower._written_at = 0.0  # a heartbeat due: the poll that rewrites the record
            started = time.perf_counter()
            follower.poll()
            heartbeat = time.perf_counter() - started
            follower.stop()
            poll_ms, base_ms = statistics.median(polls) * 1e3, statistics.median(baseline) * 1e3
            rows.append({"adapters": count, "poll_ms": round(poll_ms, 1), "baseline_ms": round(base_ms, 1),
                         "poll_over_baseline": round(poll_ms / base_ms, 2), "poll_with_heartbeat_ms":
                         round(heartbeat * 1e3, 1)})
            print(json.dumps(rows[-1]))
    record = {"benchmark": "follow_poll", "python": platform.python_version(), "rounds": args.rounds,
              "store": "embedded SQLite", "baseline": "production_adapters (serve --adapters' read at start)",
              "loadavg_before": [round(x, 2) for x in load_before],
              "loadavg_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
