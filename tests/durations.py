"""The engine-module list for `make test-fast`, from a recorded run (tests/conftest.py's RELCTL_TEST_DURATIONS).

`python -m tests.durations RECORD [--seconds S]` prints tests/engine_modules.txt: every test module in which one
test (setup + call + teardown) took more than S seconds (default 3), with its slowest test's time and the
module's total, slowest first. Modules marked slow need no line (the marker already puts them out).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

ENGINE_SECONDS = 3.0


def read_record(path: Path) -> dict[str, float]:
    """Seconds per test node id, its phases summed."""
    seconds: dict[str, float] = defaultdict(float)
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            seconds[parts[0]] += float(parts[2])
    return dict(seconds)


def engine_modules(seconds: dict[str, float], threshold: float) -> list[tuple[str, float, float]]:
    """(module, slowest test, module total) for modules with a test over `threshold`, slowest first."""
    slowest: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    for node, spent in seconds.items():
        module = node.split("::")[0]
        slowest[module] = max(slowest[module], spent)
        total[module] += spent
    found = [(m, slowest[m], total[m]) for m in slowest if slowest[m] > threshold]
    return sorted(found, key=lambda row: -row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("--seconds", type=float, default=ENGINE_SECONDS)
    args = parser.parse_args()
    print(f"# Modules make test-fast leaves out (tests/conftest.py): one test over {args.seconds:g} s in a recorded")
    print("# run (python -m tests.durations RECORD). Columns after '#': slowest test, module total, seconds.")
    for module, worst, total in engine_modules(read_record(args.record), args.seconds):
        print(f"{module}  # {worst:.1f} {total:.1f}")


if __name__ == "__main__":
    main()
