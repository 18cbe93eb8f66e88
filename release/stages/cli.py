"""Each pipeline stage as a subcommand: the very stage object `relctl promote` runs, run once into OUT."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from release.commands.support import Ctx, emit, handled, json_option

if TYPE_CHECKING:
    from release.stages.base import Stage, StageResult

existing_dir = click.Path(exists=True, file_okay=False, path_type=Path)
new_dir = click.Path(file_okay=False, path_type=Path)


R = TypeVar("R", bound="StageResult")


OUTPUT_MARKER = ".relctl-output.json"   # what a stage command wrote into OUT: its name and its files


def run_standalone(stage: Stage[Any, R], out: Path, command: str) -> R:
    """release.pipeline.runner.run_standalone, imported when a stage command runs: the pipeline brings pydantic
    and rich, the stages an engine's libraries and mlflow, none of which `relctl --help` needs
    (tests/cli/test_startup.py).
    OUT (checked before any work by `check_out`) is built under a temporary name beside it and renamed into
    place: it appears whole or not at all, and a folder the user had there is never written into.
    `command` is recorded in OUT's marker with the files written, so the same command may replace OUT later."""
    import json

    from release.core.outputs import replace_folder, staging_folder
    from release.pipeline.runner import run_standalone as run

    with staging_folder(out) as partial:
        result = run(stage, partial)
        if command != "package":   # a package lists its files in its own manifest; a marker would be unlisted
            files = sorted(p.relative_to(partial).as_posix() for p in partial.rglob("*") if not p.is_dir())
            (partial / OUTPUT_MARKER).write_text(json.dumps({"command": command, "files": files}, indent=1) + "\n")
        replace_folder(partial, out)
    return result


def written_by(command: str) -> Callable[[Path], bool]:
    """Recognises a folder `relctl <command>` wrote: its marker names the command and lists exactly the files
    there. A folder the user added a file to (or wrote, or another command wrote) is not recognised, so it is
    refused rather than replaced."""
    def recognised(folder: Path) -> bool:
        from release.core.errors import InputError
        from release.core.jsonfile import load_json

        marker = folder / OUTPUT_MARKER
        if not marker.is_file():
            return False
        try:
            data = load_json(marker, hint="", max_bytes=64 * 1024 * 1024)
        except InputError:
            return False
        if not isinstance(data, dict) or data.get("command") != command or not isinstance(data.get("files"), list):
            return False
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
        return present - {OUTPUT_MARKER} == set(data["files"])
    return recognised


def check_out(out: Path, command: str) -> Path:
    """OUT is a new or empty folder, or one this same command wrote earlier (replaced whole, atomically); never
    one holding the user's files. Checked before any input is read."""
    from release.core.outputs import check_new_folder

    if command == "package":   # a package is recognised by its own manifest (no marker: it would be unlisted)
        from release.deploy.oci import pulled_before

        return check_new_folder(out, "OUT", reusable=pulled_before)
    return check_new_folder(out, "OUT", reusable=written_by(command))


def check_checkpoint_folder(folder: Path) -> None:
    """The checks promote's intake runs (config.json's types, tokenizer.json, safetensors headers, adapter),
    so a standalone command refuses the same inputs, in seconds, before its builder or merge runs."""
    from release.stages.intake import check_checkpoint

    check_checkpoint(folder)


def check_config(folder: Path) -> None:
    """config.json of `folder` read by the one loader, its sizes and typed fields checked as intake does."""
    from release.core import checkpoint as ckpt

    ckpt.check_config_fields(ckpt.read_config(folder))


def check_tokenizer_file(path: Path) -> None:
    """A tokenizer.json the tokenizers library loads (what validation and the builder need), as intake checks."""
    from release.stages.intake import check_tokenizer

    if path.name == "tokenizer.json":
        check_tokenizer(path.parent)


# Precisions and backends are the installed backends' (checked when the stage runs; `relctl backends` lists
# them): no list here, so a new backend needs no edit and --help loads no backend.
PRECISION_HELP = "Serving precision (one an installed backend builds: relctl backends)."
BACKEND_HELP = "Backend id, or auto (the first installed backend that supports the family / built the folder)."


@click.command()
@click.argument("run_id")
@click.argument("out", type=new_dir)
@click.option("--artifact-path", default="checkpoint", show_default=True, help="Run artifact folder of the checkpoint.")
@json_option
@click.pass_obj
@handled
def intake(ctx: Ctx, run_id: str, out: Path, artifact_path: str, as_json: bool) -> None:
    """Download RUN_ID's checkpoint into OUT, check it without loading it, and print its lineage."""
    from release.registry.client import open_registry
    from release.stages.intake import IntakeInputs, IntakeStage

    check_out(out, "intake")
    stage = IntakeStage(IntakeInputs(run_id=run_id, artifact_path=artifact_path), open_registry(ctx.project_dir))
    result = run_standalone(stage, out.resolve(), "intake")
    emit(result.model_dump(mode="json"), as_json,
         lambda: click.echo(f"checkpoint in {out / result.checkpoint}: {stage.summary(result)}"))


@click.command()
@click.argument("base", type=existing_dir)
@click.argument("adapter", type=existing_dir)
@click.argument("out", type=new_dir)
@json_option
@handled
def merge(base: Path, adapter: Path, out: Path, as_json: bool) -> None:
    """Fold the PEFT LoRA adapter in ADAPTER into the BASE checkpoint; write the merged checkpoint to OUT."""
    from release.stages.merge import MergeInputs, MergeStage

    check_out(out, "merge")
    check_checkpoint_folder(base)
    result = run_standalone(MergeStage(MergeInputs(upstream="", base=base, adapter=adapter, into="")), out, "merge")
    emit(result.model_dump(mode="json"), as_json, lambda: click.echo(f"merged checkpoint written to {out}"))


@click.command()
@click.argument("model", type=existing_dir)
@click.argument("out", type=new_dir)
@click.option("--precision", default="int4", show_default=True, help=PRECISION_HELP)
@click.option("--backend", default="auto", show_default=True, help=BACKEND_HELP)
@click.option("--execution-provider", default="cpu", show_default=True, help="Device the model is built for.")
@json_option
@handled
def convert(model: Path, out: Path, precision: str, backend: str, execution_provider: str, as_json: bool) -> None:
    """Build the serving folder of the Hugging Face checkpoint MODEL at PRECISION into OUT."""
    from release.stages.convert import ConvertInputs, ConvertStage

    check_out(out, "convert")
    check_checkpoint_folder(model)   # before the builder: config.json's types, a tokenizer.json that loads
    inputs = ConvertInputs(upstream="", precision=precision, backend=backend, execution_provider=execution_provider,
                           checkpoint=model, into="")
    result = run_standalone(ConvertStage(inputs), out, "convert")
    emit(result.model_dump(mode="json"), as_json,
         lambda: click.echo(f"{precision} model for {result.backend} written to {out}"))


@click.command()
@click.argument("reference", type=existing_dir)
@click.argument("candidate", type=existing_dir)
@click.option("--prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="JSONL file of {\"prompt\": ...} lines.")
@click.option("--tokenizer", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The training tokenizer.json (default: REFERENCE/tokenizer.json).")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="release.yaml whose validation thresholds apply (default: built-in).")
@click.option("--backend", default="auto", show_default=True, help=BACKEND_HELP)
@json_option
@handled
def validate(reference: Path, candidate: Path, prompts: Path, tokenizer: Path | None, config_path: Path | None,
             backend: str, as_json: bool) -> None:
    """Compare the CANDIDATE build with its fp32 REFERENCE; exit 1 when a threshold fails."""
    from release.backends import backend_for_folder
    from release.config import load_config
    from release.core.errors import Blocked
    from release.core.hashing import sha256_file
    from release.stages.validate import ValidateInputs, ValidateStage

    cfg = load_config(config_path)
    check_tokenizer_file(tokenizer or reference / "tokenizer.json")
    inputs = ValidateInputs(reference="", candidate="", prompts_sha256=sha256_file(prompts), thresholds=cfg.validation,
                            reference_dir=reference, candidate_dir=candidate, prompts_path=prompts,
                            backend=backend_for_folder(reference, backend).id,
                            tokenizer=tokenizer or reference / "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        result = run_standalone(ValidateStage(inputs), Path(tmp), "validate")
    data = result.model_dump(mode="json")

    def text() -> None:
        for check in data["checks"]:
            mark = "pass" if check["passed"] else "FAIL"
            click.echo(f"{mark}  {check['metric']} = {check['value']:.6g} (needs {check['op']} {check['bound']})")

    emit(data, as_json, text)
    if not result.passed:
        raise Blocked(f"validation failed: {result.failures[0]}", hint="choose another precision or relax thresholds")


@click.command()
@click.argument("runtime_model", type=existing_dir)
@click.argument("source", type=existing_dir)
@click.argument("out", type=new_dir)
@click.option("--model-name", required=True, help="Name recorded in the manifest.")
@click.option("--precision", required=True, help="Precision of RUNTIME_MODEL (one an installed backend builds).")
@click.option("--backend", default="auto", show_default=True, help=BACKEND_HELP)
@json_option
@handled
def package(runtime_model: Path, source: Path, out: Path, model_name: str, precision: str, backend: str,
            as_json: bool) -> None:
    """Package the converted RUNTIME_MODEL with SOURCE's config into OUT, with sha256 of every file."""
    from release.backends import installed_precisions
    from release.config import ServingConfig
    from release.core.errors import InputError
    from release.core.model_name import check_model_name
    from release.core.package import MANIFEST, load_manifest_data
    from release.stages.package import PackageInputs, PackageStage

    if precision not in installed_precisions():
        raise InputError(f"--precision: '{precision}' is not offered by the installed backends",
                         hint=f"use one of {', '.join(installed_precisions())}")
    check_model_name(model_name, "--model-name")
    check_out(out, "package")
    check_config(source)
    fields = {"model_name": model_name, "precision": precision, "serving": ServingConfig().model_dump()}
    run_standalone(PackageStage(PackageInputs(validation="", backend=backend, fields=fields, into="",
                                              runtime_dir=runtime_model, source_dir=source)), out, "package")
    data = load_manifest_data(out / MANIFEST)
    emit(data, as_json, lambda: click.echo(f"package with {len(data['files'])} files written to {out}"))


@click.command()
@click.argument("package_dir", type=existing_dir)
@click.option("--model", "model_name", required=True, help="Registered model name.")
@click.option("--production", is_flag=True, help="Also move 'production' to the new version (no gate runs!).")
@json_option
@click.pass_obj
@handled
def register(ctx: Ctx, package_dir: Path, model_name: str, production: bool, as_json: bool) -> None:
    """Register PACKAGE_DIR as a new MLflow model version (lineage tags from its manifest)."""
    from release.commands.api import register as run_register

    version, run_id = run_register(package_dir, model_name, ctx.project_dir, production)
    emit({"model": model_name, "version": version, "release_run": run_id, "production": production}, as_json,
         lambda: click.echo(f"{model_name} v{version} registered" + (" and is production" if production else "")))


STAGE_COMMANDS = [intake, merge, convert, validate, package, register]
