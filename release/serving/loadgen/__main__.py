"""`python -m release.serving.loadgen ...`: `relctl bench` without the rest of relctl's CLI (one process
per segment in tests and pods starts faster)."""

from __future__ import annotations

from release.serving.loadgen.cli import bench_command

if __name__ == "__main__":
    bench_command(prog_name="relctl bench")
