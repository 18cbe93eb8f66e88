"""The package installs the top-level import names `release` and `gates` (issue 40: kept, documented in README,
"Import names"). A team repository with its own `release/` or `gates/` folder does not shadow them for the
`relctl` command: a console script puts its own folder on sys.path, not the current one. (`python -m release`,
`python -c` or PYTHONPATH=. from such a folder would: the README says so.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RELCTL = str(Path(sys.executable).with_name("relctl"))


def test_relctl_runs_from_a_team_repository_with_its_own_release_and_gates_folders(tmp_path: Path) -> None:
    for name in ("release", "gates"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the team repository's own {name}/')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # as a user's shell runs it
    done = subprocess.run([RELCTL, "backends", "--json"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "onnxruntime-genai" in {b["id"] for b in json.loads(done.stdout)}
