"""What a release will need of this machine, from config.json and the precision, checked before any slow
stage (`relctl check` and promote's first step): refused with the numbers (exit 2) when it cannot fit.

Predicted from the checkpoint's shape (release/backends/shape.py: parameters, and the bytes the builder writes
at the precision) and the line fitted through benchmarks/results/scaling.json (0.5B-3B Qwen2.5 shapes, each
promote inside a cgroup memory limit):
- memory: the limit the whole promote (relctl and every process it starts) completes inside,
  MEMORY_FIT[precision] = (share of the checkpoint, bytes on top); the stage nearest it named beside;
- disk: what relctl itself writes at its peak, just before the release prunes its work folder
  (release/pipeline/workdirs.py): the fetched checkpoint (twice when a LoRA adapter is merged: the merged
  copy beside it) and the candidate, whose one registry copy on a local store is a hard link
  (release/registry/package_links.py), times DISK_MARGIN plus DISK_SLACK. benchmarks/scaling.py measured
  the peak at 1.0x checkpoint + candidate at 0.5B-3B.
The machine: free disk under the project (shutil.disk_usage); memory from the cgroup limit when one is set
(a CI runner's container), else MemAvailable.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from release.core.units import size

GB = 1 << 30
# (share of the checkpoint's bytes, bytes on top): the memory limit a promote completes inside (a cgroup
# limit, page cache counted: a limit, not a peak RSS, since mapped checkpoint pages are reclaimable), and
# the stage that comes closest to it. Checked by benchmarks/scaling.py at 0.5B-3B (docs/benchmarks.md, "Scaling").
MEMORY_FIT: dict[str, tuple[float, int, str]] = {
    "int4": (0.6, GB, "reference (PyTorch over the mapped checkpoint) and convert (the builder)"),
    "int8": (0.6, GB, "reference (PyTorch over the mapped checkpoint) and convert (the builder)"),
    # fp16 is validated on the CPU one weight widened to fp32 at a time (the built-in backend's lean
    # validation, docs/disk-and-memory.md); before that the 0.5B fp16 promote was OOM-killed in validate
    # inside 1.0x + 1 GB, its fp32 copies of every weight resident together.
    "fp16": (1.0, GB, "validate (the fp16 candidate mapped, one weight at a time widened to fp32)"),
    "fp32": (2.2, GB, "convert (onnxruntime reading the fp32 external data)"),
}
DISK_SLACK = 256 << 20
DISK_MARGIN = 1.1  # the measured peak was 1.0x (scaling.json); the goal is at most 1.2x
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_UNLIMITED = 1 << 60
# The kernel keeps a memory limit in whole pages: a v1 memory.limit_in_bytes (and a v2 memory.max) written as
# N bytes reads back as N rounded down to a page. A runner given exactly the figure `relctl check` reports
# therefore shows up to a page less; that is the limit asked for, not a smaller machine.
PAGE = 4096


def page_floor(n_bytes: int) -> int:
    """`n_bytes` rounded down to a whole page, as the kernel stores a cgroup memory limit."""
    return n_bytes - n_bytes % PAGE


@dataclass(frozen=True)
class Needs:
    precision: str
    checkpoint_bytes: int
    candidate_bytes: int
    memory_bytes: int
    memory_set_by: str
    disk_bytes: int

    def describe(self) -> str:
        return (f"{self.precision} of a {size(self.checkpoint_bytes)} checkpoint (candidate "
                f"{size(self.candidate_bytes)}): needs about {size(self.memory_bytes)} of memory (set by "
                f"{self.memory_set_by}) and {size(self.disk_bytes)} of disk")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def needs(config: dict[str, Any], precision: str, provider: str, merges_adapter: bool = False) -> Needs | None:
    """The release's needs, or None when the shape cannot be read (the contract check names that).
    `merges_adapter`: the run logged a LoRA adapter, merged into a second checkpoint-sized copy."""
    from release.backends.shape import builder_weights_bytes, parameter_count, shape_from_config  # noqa: PLC0415

    if precision not in MEMORY_FIT:
        return None
    try:
        shape = shape_from_config(config)
    except Exception:
        return None
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    checkpoint = parameter_count(shape) * _DTYPE_BYTES.get(dtype, 4)
    candidate = builder_weights_bytes(shape, precision, "cuda" if provider == "cuda" else "cpu")  # type: ignore[arg-type]
    share, extra, stage = MEMORY_FIT[precision]
    return Needs(precision, checkpoint, candidate, int(share * checkpoint + extra), stage,
                 int(DISK_MARGIN * ((2 if merges_adapter else 1) * checkpoint + candidate)) + DISK_SLACK)


def cgroup_memory_limit() -> int | None:
    """This process's memory limit from its cgroup and its ancestors (v2 memory.max, v1
    memory.limit_in_bytes); None when none is set. Inside a container the mount's root is the container's
    own group, so the group's path from /proc/self/cgroup is matched by its longest tail that exists."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mount, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            mount, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        here = next((mount.joinpath(*parts[i:]) for i in range(len(parts) + 1)
                     if mount.joinpath(*parts[i:]).is_dir()), None)
        while here is not None and here.is_relative_to(mount):
            try:
                text = (here / name).read_text().strip()
            except OSError:
                text = ""
            if text.isdigit() and int(text) < _UNLIMITED:
                limits.append(int(text))
            here = here.parent if here != mount else None
    return min(limits) if limits else None


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class Machine:
    memory_bytes: int | None
    memory_source: str
    disk_free_bytes: int
    disk_path: str


def machine(project_dir: Path) -> Machine:
    limit = cgroup_memory_limit()
    memory, source = (limit, "cgroup limit") if limit is not None else (mem_available(), "MemAvailable")
    where = project_dir if project_dir.exists() else Path.cwd()
    return Machine(memory, source, shutil.disk_usage(where).free, str(where))


def shortfalls(need: Needs, have: Machine) -> list[tuple[str, str]]:
    """(error, hint) for each resource the machine lacks."""
    out = []
    if have.memory_bytes is not None and page_floor(need.memory_bytes) > have.memory_bytes:
        # Exact bytes beside the rounded sizes: two figures a page apart both read "9.97 GiB".
        out.append((f"this release needs about {size(need.memory_bytes)} ({need.memory_bytes:,} bytes; a limit "
                    f"of {page_floor(need.memory_bytes):,} bytes or more is enough, the kernel rounding it to "
                    f"a {PAGE}-byte page) of memory and the machine has {size(have.memory_bytes)} "
                    f"({have.memory_bytes:,} bytes, {have.memory_source}): {need.describe()}",
                    "run it on a runner with more memory, or choose a smaller precision (int4 needs the least)"))
    if need.disk_bytes > have.disk_free_bytes:
        out.append((f"this release needs about {size(need.disk_bytes)} of disk and {have.disk_path} has "
                    f"{size(have.disk_free_bytes)} free: {need.describe()}",
                    "free disk (relctl gc --yes removes finished releases' work folders) or use a larger disk"))
    return out
