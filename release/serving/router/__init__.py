"""The canary router: weighted, sticky, streaming reverse proxy in front of production and candidate.

    app.py      the ASGI proxy (Router): split, shadow mirror, admin endpoint, records
    tally.py    timing and token counts read from the bytes passing through
    records.py  RouterRecord (a superset of the load generator's Record) and its JSONL
    server.py   RouterServer: the router on 127.0.0.1 in a background thread
"""

from release.serving.loadgen.runner import write_records
from release.serving.router.app import Router, fraction
from release.serving.router.records import RouterRecord, read_records
from release.serving.router.server import RouterServer

__all__ = ["Router", "RouterRecord", "RouterServer", "fraction", "read_records", "write_records"]
