"""The router as a process of its own: `python -m release.serving.router --production URL --candidate URL`.

Weights move through POST /relctl/weights; on SIGTERM/SIGINT the records go to --records (JSONL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

import uvicorn

from release.serving.loadgen.client import run_async
from release.serving.loadgen.runner import write_records
from release.serving.router.app import Router


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m release.serving.router", description=__doc__)
    parser.add_argument("--production", required=True, help="production's OpenAI-compatible base URL")
    parser.add_argument("--candidate", required=True, help="the candidate's OpenAI-compatible base URL")
    parser.add_argument("--candidate-weight", type=float, default=0.0, help="share to the candidate, 0..1")
    parser.add_argument("--shadow", type=float, default=0.0, help="share of production's requests mirrored")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, help="written with {url} once listening")
    parser.add_argument("--records", type=Path, help="JSONL of every request, written at shutdown")
    parser.add_argument("--record-text", action="store_true", help="keep each answer's text in the records")
    args = parser.parse_args()
    router = Router(args.production, args.candidate, args.candidate_weight, args.shadow, args.record_text)
    server = uvicorn.Server(uvicorn.Config(router, host=args.host, port=args.port, lifespan="on",
                                           log_level="warning", access_log=False, backlog=4096))
    # uvicorn re-raises a captured SIGTERM after its graceful shutdown; with this no-op handler in place the
    # re-raise does nothing, so the records below still get written.
    signal.signal(signal.SIGTERM, lambda *_: None)
    run_async(_serve(server, args.ready_file))
    if args.records is not None:
        write_records(args.records, router.records)


async def _serve(server: uvicorn.Server, ready_file: Path | None) -> None:
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise SystemExit("router: could not start listening (is the port in use?)")
        await asyncio.sleep(0.01)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    if ready_file is not None:
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"url": f"http://{host}:{port}"}))
        tmp.rename(ready_file)
    await task


if __name__ == "__main__":
    main()
