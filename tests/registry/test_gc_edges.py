"""`relctl gc` on registries and work folders a user can make (issue 40): a model name with a quote is searched
for, not pasted into the filter (it was exit 3), and a symlinked work folder gc cannot delete is reported "kept",
never "removed"."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from release.cli import cli
from release.registry import Registry
from release.registry import tags as T
from release.registry.states import RELEASED
from release.registry.store import connect, resolve_store


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def _released(project: Path, model: str, run: str) -> None:
    """A registered version of `run` in a finished state: its work folder is gc's to remove."""
    store = resolve_store(project)
    connect(store)
    client = Registry(store).client
    client.create_registered_model(model)
    client.create_model_version(model, source=(project / "pkg").as_uri(),
                                tags={T.TRAINING_RUN: run, T.RELEASE_STATE: RELEASED})


def test_gc_finds_the_finished_runs_of_a_model_named_with_a_quote(project_dir: Path) -> None:
    _released(project_dir, "team's-model", "0123abcd")
    (project_dir / ".relctl" / "work" / "0123abcd").mkdir(parents=True)
    listed = relctl(project_dir, "gc", "--json")
    assert listed.exit_code == 0, listed.output + listed.stderr
    assert [r["run"] for r in json.loads(listed.stdout) if r["would_remove"]] == ["0123abcd"]


def test_gc_says_kept_for_a_symlinked_work_folder_and_leaves_its_target(project_dir: Path, tmp_path: Path) -> None:
    _released(project_dir, "m", "0123abcd")
    target = tmp_path / "elsewhere"
    (target / "intake-000000000000").mkdir(parents=True)
    (target / "intake-000000000000" / "model.safetensors").write_bytes(b"\0" * 64)
    work_root = project_dir / ".relctl" / "work"
    work_root.mkdir(parents=True)
    (work_root / "0123abcd").symlink_to(target)
    done = relctl(project_dir, "gc", "--yes")
    assert done.exit_code == 0, done.output + done.stderr
    line = next(x for x in done.stdout.splitlines() if "0123abcd" in x)
    assert line.startswith("kept") and "symlink" in line, done.stdout
    assert (work_root / "0123abcd").is_symlink() and (target / "intake-000000000000" / "model.safetensors").exists()
    rows = json.loads(relctl(project_dir, "gc", "--yes", "--json").stdout)
    assert rows[0]["removed"] is False
