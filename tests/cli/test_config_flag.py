"""`-c FILE` beside `--project-dir` (issue 40): FILE is read relative to the project folder, as the default
PROJECT_DIR/release.yaml is; a missing one names the path it looked at and how -c is resolved (not "omit it for
defaults", which would release with other settings); and every error about the file names it, not release.yaml."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from release.cli import cli

RUN = "0" * 32


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def test_a_relative_config_file_is_read_from_the_project_folder(project_dir: Path) -> None:
    (project_dir / "staging.yaml").write_text("model: tiny\ngates:\n  evall: {}\n")
    result = relctl(project_dir, "check", RUN, "-c", "staging.yaml")   # the test's cwd is not the project
    assert result.exit_code == 2, result.output
    assert "error: staging.yaml: unknown gate 'gates.evall'" in result.stderr
    assert "hint: did you mean 'eval'?" in result.stderr
    from release.config import config_path

    assert config_path(project_dir, Path("/abs/x.yaml")) == Path("/abs/x.yaml")
    assert config_path(project_dir, None) is None   # no release.yaml: the built-in defaults


def test_a_bad_key_in_a_gate_block_names_the_config_file(project_dir: Path) -> None:
    (project_dir / "staging.yaml").write_text("model: tiny\ngates:\n  load:\n    sweep_rates: [0]\n")
    result = relctl(project_dir, "check", RUN, "-c", "staging.yaml")
    assert result.exit_code == 2, result.output
    assert "error: staging.yaml: gates.load.sweep_rates.0:" in result.stderr and "release.yaml:" not in result.stderr


def test_a_missing_config_file_names_the_path_and_how_it_is_resolved(project_dir: Path) -> None:
    result = relctl(project_dir, "check", RUN, "-c", "nope.yaml")
    assert result.exit_code == 2, result.output
    assert f"error: {project_dir / 'nope.yaml'}: no such config file" in result.stderr
    hint = result.stderr.splitlines()[-1]
    assert hint.startswith("hint: -c FILE is read relative to the project folder") and "omit" not in hint


def test_a_gate_problem_found_by_check_names_the_config_file(project_dir: Path) -> None:
    from release.registry import Registry
    from release.registry.store import connect, resolve_store

    store = resolve_store(project_dir)
    connect(store)
    client = Registry(store).client
    run = client.create_run(client.create_experiment("tiny")).info.run_id   # a run with nothing logged: problems
    (project_dir / "staging.yaml").write_text("model: tiny\ngates:\n  eval: {}\n")
    result = relctl(project_dir, "check", run, "-c", "staging.yaml")
    assert result.exit_code == 2, result.output
    assert "error: staging.yaml: gates.eval sets no thresholds" in result.stderr, result.stderr
    assert "release.yaml:" not in result.stderr
