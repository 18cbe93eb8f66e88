"""A command run inside a real memory limit: a child group of the v1 cgroup memory controller.

The group is made with `mkdir /sys/fs/cgroup/memory/relctl-limit-<pid>-<n>`, its limit written to
memory.limit_in_bytes (and memory.memsw.limit_in_bytes where the kernel accounts swap, so the limit cannot
be escaped into swap), and the child puts its own pid into the group's cgroup.procs between fork and exec,
so it and every process it starts (the builder, the reference worker) run inside the limit from their
first byte. The group counts page cache, as a CI runner's limit does; past the limit the kernel reclaims
cache and then OOM-kills. After the command, the group's peak (memory.max_usage_in_bytes) and OOM kills
(memory.oom_control) are read, and the group is removed with rmdir once it is empty (retried while the
last processes exit). Needs root and the v1 controller mounted at /sys/fs/cgroup/memory (`available()`).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")
_counter = itertools.count()


def available() -> str | None:
    """None when a limited run is possible here, else why not."""
    if not (ROOT / "cgroup.procs").is_file():
        return f"no v1 memory controller at {ROOT}"
    if not os.access(ROOT, os.W_OK):
        return f"{ROOT} is not writable (needs root)"
    return None


@dataclass(frozen=True)
class LimitedRun:
    returncode: int
    limit_bytes: int
    peak_bytes: int      # memory.max_usage_in_bytes: RSS and page cache of every process in the group
    oom_kills: int
    seconds: float
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.oom_kills > 0 or self.returncode in (-9, 137)


class MemoryGroup:
    """A child group with a memory limit (see the module docstring); `enter` is a Popen preexec_fn."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.path = ROOT / f"relctl-limit-{os.getpid()}-{next(_counter)}"

    def __enter__(self) -> MemoryGroup:
        self.path.mkdir()
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.is_file():
                memsw.write_text(str(self.limit_bytes))
        except BaseException:
            self.path.rmdir()
            raise
        return self

    def enter(self) -> None:
        """In the child, before exec: it and everything it starts are inside the limit."""
        with open(self.path / "cgroup.procs", "w") as fh:
            fh.write(str(os.getpid()))

    def peak_bytes(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return int(oom.get("oom_kill", 0))

    def __exit__(self, *exc: object) -> None:
        _remove(self.path)


def run_limited(cmd: Sequence[str], limit_bytes: int, env: dict[str, str] | None = None,
                timeout_s: float = 3600, cwd: Path | None = None) -> LimitedRun:
    with MemoryGroup(limit_bytes) as group:
        started = time.monotonic()
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=cwd, preexec_fn=group.enter)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return LimitedRun(proc.returncode, limit_bytes, group.peak_bytes(), group.oom_kills(),
                          time.monotonic() - started, out, err)


def _remove(group: Path) -> None:
    """rmdir the group once its last process has gone (a grandchild may outlive the command briefly)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), 9)  # a process of this command's own group, left behind
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
