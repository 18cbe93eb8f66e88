"""`python -m release.stages.reference_worker ...`: the reference stage's worker process (see reference.py).

Bad input prints one `error:` line and exits 2; anything else is a traceback and a non-zero exit, which
the stage reports with the log's last line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from release.core.errors import InputError
from release.stages.reference import run_worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release.stages.reference_worker")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        run_worker(args.backend, args.checkpoint, args.prompts, args.max_new_tokens, args.out)
    except InputError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
