"""One seeded plan split across hosts, and the per-host records merged back into one run.

Like k6's execution segments, every host computes the same whole plan (same seed, same send times and
contents) and takes its share of it: with N equal segments, plan index j belongs to segment j mod N. The
segments are disjoint and their union is exactly the single-host plan; striping (rather than cutting the
plan into N time slices) gives each host 1/N of the rate for the whole run, bursts included. All hosts
start at one wall-clock time, so every record's `scheduled_s` is an offset from the same instant, and the
merged summary is computed from the union of the records: the same percentiles a single host would
report, never an average of per-host percentiles.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from release.core.errors import InputError
from release.core.jsonfile import expect, load_json_object, optional, read_jsonl
from release.serving.loadgen.client import Record
from release.serving.loadgen.dataset import Sample


@dataclass(frozen=True)
class Segment:
    """Segment `index` (0-based) of `count` equal segments."""

    index: int
    count: int

    def indices(self, n: int) -> list[int]:
        """The plan positions of this segment, in plan order."""
        return list(range(self.index, n, self.count))

    def to_json(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_segment(text: str) -> Segment:
    """'i/N' with 0 <= i < N (the Kubernetes completion index of N pods)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 0 <= int(match[1]) < int(match[2]):
        raise InputError(f"--segment {text}: expected i/N with 0 <= i < N",
                         hint="e.g. --segment 0/4 ... --segment 3/4 for four hosts")
    return Segment(int(match[1]), int(match[2]))


def start_offset(start_at: float, now_epoch: float | None = None) -> float:
    """Seconds from now until the shared wall-clock start `start_at` (Unix time); InputError if it passed."""
    delay = start_at - (time.time() if now_epoch is None else now_epoch)
    if delay < 0:
        raise InputError(f"--start-at {start_at:.3f}: that time passed {-delay:.1f}s ago",
                         hint="pick a start far enough ahead for every host to be ready, e.g. $(( $(date +%s) + 60 ))")
    return delay


def plan_digest(offsets: np.ndarray, samples: list[Sample]) -> str:
    """A fingerprint of the whole plan: segments of one plan have the same digest on every host."""
    h = hashlib.sha256(np.ascontiguousarray(offsets, dtype=np.float64).tobytes())
    for sample in samples:
        h.update(f"{sample.output_tokens}\0{sample.prompt}\0".encode())
    return h.hexdigest()[:16]


@dataclass
class SegmentRun:
    """What one segment's folder holds: its summary.json fields and records."""

    folder: Path
    report: dict[str, Any]
    records: list[Record]


def read_segment(folder: Path) -> SegmentRun:
    summary = folder / "summary.json"
    if not summary.is_file():
        raise InputError(f"{folder}: no summary.json", hint="pass the --out folders of `relctl bench --segment` runs")
    hint = "merge folders written by `relctl bench --segment i/N`"
    label = f"{folder.name}/summary.json"
    report = load_json_object(summary, hint, label)
    runs = optional(report, "runs", list, label, hint) or []
    if report.get("segment") is None or len(runs) != 1 or not isinstance(runs[0], dict):
        raise InputError(f"{folder}: not a segment run", hint=hint)
    path = Path(expect(runs[0], "records", str, label, hint))
    path = path if path.is_file() else folder / path.name
    if not path.is_file():
        raise InputError(f"{folder}: records file {path.name} is missing", hint="copy the whole --out folder")
    fields = set(Record.__dataclass_fields__)
    rows = read_jsonl(path, hint="copy the whole --out folder of the segment run")
    bad = next((number for number, row in rows if not isinstance(row, dict)), None)
    if bad is not None:
        raise InputError(f"{path.name}: line {bad} is not a JSON object", hint="copy the whole --out folder")
    records = [Record(**{k: v for k, v in row.items() if k in fields}) for _, row in rows]
    return SegmentRun(folder, report, records)


def union_records(runs: list[SegmentRun]) -> tuple[list[Record], dict[str, Any]]:
    """All records of one plan's segments, checked: one plan, every segment once, every index once."""
    if not runs:
        raise InputError("bench merge: no folders given", hint="relctl bench merge out-0 out-1 ...")
    first = runs[0].report
    digests = {run.report.get("plan_digest") for run in runs}
    if len(digests) != 1:
        raise InputError("bench merge: the folders hold segments of different plans",
                         hint="run every segment with the same --rate, --requests, --seed, --dataset/--trace")
    count = int(first["segment"]["count"])
    seen = sorted(int(run.report["segment"]["index"]) for run in runs)
    if seen != list(range(count)) or any(int(r.report["segment"]["count"]) != count for r in runs):
        missing = sorted(set(range(count)) - set(seen))
        raise InputError(f"bench merge: segments {seen} of {count} given"
                         + (f"; missing {missing}" if missing else "; some more than once"),
                         hint=f"pass the --out folder of each of the {count} segments exactly once")
    records = sorted((rec for run in runs for rec in run.records), key=lambda r: r.index)
    planned = int(first["plan_requests"])
    if [r.index for r in records] != list(range(planned)):
        raise InputError(f"bench merge: {len(records)} records for a plan of {planned} requests",
                         hint="a segment ended early; rerun it")
    return records, first
