"""The README's "Bring your own run" snippet, run as written, gives a run that meets the contract."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from click.testing import CliRunner

from release.cli import cli
from release.registry.store import connect, ensure_experiment, resolve_store

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet() -> str:
    text = README.read_text()
    section = text[text.index("## Bring your own run"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Bring your own run section has no python block"
    return match.group(1)


def test_the_readme_snippet_logs_a_releasable_run(project_dir: Path, tiny_checkpoint: Path, tiny_data: Path,
                                                  tmp_path: Path) -> None:
    store = resolve_store(project_dir)
    connect(store)
    ensure_experiment(store, "my-own-model")   # relctl's artifact location; the snippet sets it current
    namespace: dict[str, object] = {}
    exec(compile(snippet(), "README.md", "exec"), namespace)
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, checkpoint)
    log = namespace["log_for_relctl"]
    run_id = log("my-own-model", str(checkpoint), str(tiny_data / "validation" / "prompts.jsonl"),  # type: ignore[operator]
                 str(tiny_data / "eval.jsonl"))
    (project_dir / "release.yaml").write_text("gates:\n  eval: {thresholds: {exact_match: {threshold: 0.0}}}\n")
    result = CliRunner().invoke(cli, ["--project-dir", str(project_dir), "check", run_id, "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    assert '"ok": true' in result.stdout
    assert "data digests" not in result.stderr  # the snippet records one
