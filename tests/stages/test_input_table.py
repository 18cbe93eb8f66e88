"""Bad input is exit 2, found early, never a bug (3) or an infrastructure failure (4).

One table: each row breaks one thing a user controls (release.yaml, a command-line argument, the
training run's experiment name, config.json, tokenizer.json, a safetensors header, adapter_config.json)
and runs the real command on the tiny example's checkpoint in an embedded MLflow store. Every row must
end in exit 2 with one `error:` line and its `hint:`, within seconds, with nothing registered and no
stage output beyond intake.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.registry import Registry
from release.registry.store import connect, ensure_experiment, resolve_store

pytestmark = pytest.mark.slow


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def log_run(project: Path, checkpoint: Path, experiment: str = "bad-input") -> str:
    store = resolve_store(project)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, experiment)) as run:
        mlflow.log_artifacts(str(checkpoint), "checkpoint")
        mlflow.log_text('{"prompt": "reverse a b c d ->"}\n', "validation/prompts.jsonl")
    return str(run.info.run_id)


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _overlap(path: Path) -> None:
    """Point one tensor at another's bytes: a header safetensors itself refuses to load."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    by_size: dict[int, str] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        size = spec["data_offsets"][1] - spec["data_offsets"][0]
        if size in by_size:
            spec["data_offsets"] = list(header[by_size[size]]["data_offsets"])
            break
        by_size[size] = name
    new = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


@dataclass(frozen=True)
class Case:
    message: str                                   # in the one error line
    checkpoint: Callable[[Path], None] = lambda _: None
    release_yaml: bytes | None = None
    args: tuple[str, ...] = ()                     # promote's extra arguments
    experiment: str = "bad-input"
    command: str = "promote"                       # or "check"


CASES: dict[str, Case] = {
    "model name with a quote": Case("model name \"it's\" is not valid", release_yaml=b"model: it's\n"),
    "model name with a slash": Case("model name 'team/llm' is not valid", release_yaml=b"model: team/llm\n"),
    "--model with a quote": Case("model name \"o'brien\" is not valid", args=("--model", "o'brien")),
    "experiment name with a slash": Case("the run's experiment name is no model name", experiment="team/exp"),
    "experiment name with a quote, check": Case("the run's experiment name is no model name",
                                                experiment="bob's runs", command="check"),
    "run logged without an experiment": Case("was logged without an experiment (MLflow's 'Default')",
                                             experiment="Default"),
    "run logged without an experiment, check": Case("its release would register a model named 'Default'",
                                                    experiment="Default", command="check"),
    "require names an unconfigured gate, check": Case("require lists eval, which gates: does not configure",
                                                       release_yaml=b"require: [eval]\n", command="check"),
    "require names an unconfigured gate": Case("require lists eval, which gates: does not configure",
                                               release_yaml=b"require: [eval]\n"),
    "release.yaml not UTF-8": Case("release.yaml: not UTF-8 text", release_yaml=b"model: caf\xe9\n"),
    "negative layer count": Case("'num_hidden_layers' is -2, not a positive integer",
                                 checkpoint=lambda f: _edit_json(f / "config.json", num_hidden_layers=-2)),
    "hidden size as text": Case("'hidden_size' is '64', not a positive integer",
                                checkpoint=lambda f: _edit_json(f / "config.json", hidden_size="64")),
    "rms_norm_eps as a list": Case("'rms_norm_eps' is [1e-05], not a positive number",
                                   checkpoint=lambda f: _edit_json(f / "config.json", rms_norm_eps=[1e-5])),
    "tokenizer.json of random bytes": Case(
        "tokenizer.json: not UTF-8 text", checkpoint=lambda f: (f / "tokenizer.json").write_bytes(
            bytes(range(256)) * 64)),
    "overlapping safetensors tensors": Case("overlaps the tensor before it",
                                            checkpoint=lambda f: _overlap(f / "model.safetensors")),
    "lora_alpha NaN": Case("lora_alpha and alpha_pattern values must be finite numbers",
                           checkpoint=lambda f: _edit_json(f / "adapter_config.json", lora_alpha=float("nan"))),
    "lora r negative": Case("r and rank_pattern values must be positive integers",
                            checkpoint=lambda f: _edit_json(f / "adapter_config.json", r=-8)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_exit_2_in_one_line_with_nothing_registered(name: str, project_dir: Path,
                                                                  tiny_checkpoint: Path, tmp_path: Path) -> None:
    case = CASES[name]
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, folder)
    case.checkpoint(folder)
    run_id = log_run(project_dir, folder, case.experiment)
    if case.release_yaml is not None:
        (project_dir / "release.yaml").write_bytes(case.release_yaml)
    started = time.monotonic()
    result = relctl(project_dir, case.command, *case.args, run_id)
    assert result.exit_code == 2, result.output + result.stderr
    assert time.monotonic() - started < 30  # seconds on an idle machine; the suite's neighbours get slack
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and case.message in errors[0], lines
    assert lines[-2] == errors[0] and lines[-1].startswith("hint: "), lines
    assert Registry(resolve_store(project_dir)).list_models() == []
    # Nothing beyond intake ran: the problem is found before any slow stage.
    work = project_dir / ".relctl" / "work"
    assert not [p for p in work.rglob("*") if p.is_dir() and p.name.startswith(("merge-", "convert-",
                                                                                "reference-"))]


def test_check_and_promote_refuse_the_same_release_yaml(project_dir: Path, tiny_checkpoint: Path) -> None:
    """`relctl check` runs promote's validation: what it passes, promote does not refuse as input."""
    run_id = log_run(project_dir, tiny_checkpoint)
    (project_dir / "release.yaml").write_text(
        "require: [safety]\ngates:\n  eval: {thresholds: {exact_match: {threshold: 0.0}}}\n")
    check, promote = relctl(project_dir, "check", run_id), relctl(project_dir, "promote", run_id)
    assert check.exit_code == promote.exit_code == 2, check.stderr + promote.stderr

    def said(r: Result) -> list[str]:
        return [line for line in r.stderr.splitlines() if line.startswith(("error: ", "hint: "))]

    assert said(check) == said(promote) and "require lists safety" in said(check)[0]


@pytest.mark.parametrize("command", [("rollback", "it's"), ("status", "a/b"), ("history", "x'y")])
def test_a_bad_model_name_on_the_command_line_is_bad_input(project_dir: Path, command: tuple[str, str]) -> None:
    result = relctl(project_dir, *command)
    assert result.exit_code == 2, result.output + result.stderr
    assert result.stderr.splitlines()[0] == f"error: model: model name {command[1]!r} is not valid: use " \
        "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters"
    assert not (project_dir / ".relctl").exists()  # refused before the store was opened


def test_merge_refuses_an_overlapping_header_and_a_nan_alpha(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`relctl merge` on its own: exit 2 and no output folder, where it wrote an unloadable file or NaNs."""
    for breaker, message in ((lambda f: _overlap(f / "model.safetensors"), "overlaps the tensor before it"),
                             (lambda f: _edit_json(f / "adapter_config.json", lora_alpha=float("inf")),
                              "finite numbers")):
        folder = tmp_path / "in"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(tiny_checkpoint, folder)
        breaker(folder)
        out = tmp_path / "merged"
        result = CliRunner().invoke(cli, ["merge", str(folder), str(folder), str(out)])
        assert result.exit_code == 2, result.output + result.stderr
        assert message in result.stderr and not (out.exists() and any(out.iterdir()))
