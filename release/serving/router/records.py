"""The router's per-request record: the load generator's Record plus which side served it and how.

One JSON object per line (docs/canary.md); an external source (a replica's own access log, a Prometheus
exporter) that writes the same fields can be judged the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from release.core.errors import InputError
from release.core.jsonfile import read_jsonl
from release.serving.loadgen.client import Record


@dataclass
class RouterRecord(Record):
    """One proxied request as the router saw it; times are the router's (send = forwarded upstream)."""

    request_id: str = ""
    backend: str = ""
    mirrored: bool = False        # a shadow copy: its answer went nowhere
    step: str = ""
    path: str = ""
    model: str | None = None      # X-Relctl-Model / X-Relctl-Version / X-Relctl-Serving-Config of the answer
    version: str | None = None
    serving_config: str | None = None
    adapter: str | None = None    # X-Relctl-Adapter / -Adapter-Version: the adapter version that answered
    adapter_version: str | None = None
    sent_at: float = 0.0          # unix time forwarded upstream
    first_token_at: float | None = None
    last_token_at: float | None = None
    text: str | None = None       # the generated text, when the router records text (output quality)


def read_records(path: Path) -> list[RouterRecord]:
    """Records from JSONL; unknown fields are ignored, so newer writers stay readable."""
    known = {f.name for f in fields(RouterRecord)}
    out = []
    for number, row in read_jsonl(path, hint="records are written by relctl's router; pass its records file"):
        if not isinstance(row, dict):
            raise InputError(f"{path.name}: line {number} is not a JSON object", hint="pass the router's records file")
        out.append(RouterRecord(**{k: v for k, v in row.items() if k in known}))
    return out
