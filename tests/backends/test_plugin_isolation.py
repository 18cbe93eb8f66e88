"""Nothing a plug-in does at import ends or changes a command: `sys.exit(0)`, `SystemExit(3)` after printing
to stdout, a BaseException. Each is a real distribution (a dist-info with entry_points.txt) on a private
path; relctl runs as a subprocess with that path first, as an installed plug-in would be found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RELCTL = str(Path(sys.executable).with_name("relctl"))
PLUGINS = {
    "exits-zero": "import sys\nsys.exit(0)\n",
    "prints-and-exits": "print('{\"forged\": true}')\nraise SystemExit(3)\n",
    "base-exception": "class Boom(BaseException):\n    pass\nraise Boom('from import')\n",
}


def hostile_site(root: Path, entry: str, gate: bool = False) -> Path:
    """A distribution whose `relctl.backends` (or `relctl.gates`) entry point `entry` runs PLUGINS[entry]."""
    site = root / "site"
    module = entry.replace("-", "_")
    info = site / f"relctl_{module}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: relctl-{entry}\nVersion: 0.1\n")
    group = "relctl.gates" if gate else "relctl.backends"
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry} = relctl_{module}:Thing\n")
    (site / f"relctl_{module}.py").write_text(PLUGINS[entry])
    return site


def run(site: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([RELCTL, *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd)


@pytest.mark.parametrize("entry", list(PLUGINS))
def test_a_plugin_that_exits_or_prints_at_import_changes_nothing(tmp_path: Path, entry: str) -> None:
    site = hostile_site(tmp_path, entry)
    listed = run(site, "backends", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "onnxruntime-genai" in {b["id"] for b in json.loads(listed.stdout)}   # stdout is still only JSON
    assert f"backend '{entry}' is installed but does not load" in listed.stderr
    assert f"relctl_{entry.replace('-', '_')}:Thing" in listed.stderr


@pytest.mark.parametrize("entry", list(PLUGINS))
def test_a_broken_plugin_named_in_release_yaml_is_reported_broken_and_promote_fails(tmp_path: Path,
                                                                                   entry: str) -> None:
    site = hostile_site(tmp_path, entry)
    project = tmp_path / "project"
    project.mkdir()
    (project / "release.yaml").write_text(f"model: tiny-llm\nconvert:\n  backend: {entry}\n")
    done = run(site, "--project-dir", str(project), "promote", "0" * 32)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    first = next(line for line in done.stderr.splitlines() if line.startswith("error:"))   # its print is stderr's
    assert "failed to load" in first and f"relctl_{entry.replace('-', '_')}:Thing" in first, first
    assert "not offered by the installed backends" not in done.stderr
    assert done.stdout == ""


def test_a_gate_plugin_that_exits_at_import_is_exit_2_naming_it(tmp_path: Path) -> None:
    site = hostile_site(tmp_path, "exits-zero", gate=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "release.yaml").write_text("model: tiny-llm\ngates:\n  exits-zero: {}\n")
    done = run(site, "--project-dir", str(project), "promote", "0" * 32)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "gate plug-in 'relctl_exits_zero:Thing' failed to load: it called sys.exit(0)" in done.stderr
