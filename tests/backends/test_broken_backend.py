"""A backend plug-in that fails to import is named, and takes no working backend down with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RELCTL = str(Path(sys.executable).with_name("relctl"))


def broken_site(root: Path) -> Path:
    """A distribution on a private path whose `relctl.backends` entry point names a module that raises."""
    site = root / "site"
    info = site / "relctl_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relctl-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[relctl.backends]\nbroken-engine = relctl_broken:Engine\n")
    (site / "relctl_broken.py").write_text("raise ImportError('its native library is missing')\n")
    return site


def test_a_broken_plugin_is_named_and_the_others_still_work(tmp_path: Path, tiny_base_only: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_site(tmp_path)), os.environ.get("PYTHONPATH", "")])}
    listed = subprocess.run([RELCTL, "backends", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "onnxruntime-genai" in {b["id"] for b in json.loads(listed.stdout)}
    assert "backend 'broken-engine' is installed but does not load" in listed.stderr
    assert "its native library is missing" in listed.stderr
    # Asked for by name: exit 2 with the reason, before anything is built.
    asked = subprocess.run([RELCTL, "convert", str(tiny_base_only), str(tmp_path / "out"), "--precision", "fp32",
                            "--backend", "broken-engine"], capture_output=True, text=True, env=env, timeout=120)
    assert asked.returncode == 2, asked.stderr
    assert "its native library is missing" in asked.stderr
    assert not any((tmp_path / "out").glob("*"))
