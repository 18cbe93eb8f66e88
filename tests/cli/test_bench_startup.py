"""`relctl bench` reaches its first request without the heavy stack: a short CI load test pays every import
before it sends anything (benchmarks/bench_startup.py measures it; the README quotes it).

A fresh interpreter imports the CLI and every module `relctl bench URL` imports before its first request
(release/serving/loadgen/cli.py's run_command), then prints what it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cli.test_startup import HEAVY, REPO_ROOT

# What bench must not import before it sends: the heavy stack, plus httpx (and its TLS context: ~0.25 s; the
# one GET of /v1/models goes through urllib) and release.config (pydantic models and yaml for release.yaml,
# which bench never reads: ~0.2 s).
NOT_BEFORE_FIRST_REQUEST = {*HEAVY, "httpx", "yaml"}

PROBE = """
import json, sys
import release.cli
from release.serving.loadgen.bench import run_bench
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.runner import Traffic
from release.serving.loadgen.segments import parse_segment
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


def test_bench_imports_nothing_heavy_before_its_first_request() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES="))
    modules = set(json.loads(line.removeprefix("MODULES=")))
    assert "release.serving.loadgen.client" in modules  # the probe really imported bench's path
    top = {name.split(".")[0] for name in modules}
    assert not top & NOT_BEFORE_FIRST_REQUEST, sorted(top & NOT_BEFORE_FIRST_REQUEST)
    assert "release.config" not in modules
