"""Convert: a merged Hugging Face checkpoint becomes the folder one serving engine loads, at one precision.

Which engine is the backend's business (release/backends/): this stage checks the checkpoint, asks the
chosen backend to build into `<out>.partial`, and renames it last, so the folder appears whole or not at
all. The backend's log goes to `<out>.convert.log` beside the folder (not inside it: the folder is what
gets packaged and hashed).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr

from release.backends import AUTO, Backend, choose_backend, get_backend
from release.backends.variants import base_precision
from release.core.checkpoint import has_adapter, read_config, refuse_pickles, weight_files
from release.core.errors import InputError
from release.stages.base import Stage, StageInputs, StageResult, location, output_folder


class ConvertOutputs(StageResult):
    """What convert produced and with which tools; `files` maps relative path -> bytes."""

    model: str
    precision: str
    backend: str
    execution_provider: str
    versions: dict[str, str]
    files: dict[str, int]
    tokenizer_parity: bool | None
    notes: list[str]
    wall_time_s: float = 0.0
    # Where convert() wrote it (not part of the stage result: the pipeline resolves `model` in its folder).
    _out_dir: Path | None = PrivateAttr(None)

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def out_dir(self) -> Path:
        if self._out_dir is None:
            raise ValueError("this result was read back from a stage manifest; resolve `model` in its stage folder")
        return self._out_dir


def convert(model_dir: Path, out_dir: Path, precision: str, backend: str = AUTO,
            execution_provider: str = "cpu", engine_settings: dict[str, Any] | None = None) -> ConvertOutputs:
    """Export the merged checkpoint `model_dir` into `out_dir` at `precision` with `backend` (or the first
    installed backend that supports the family); `engine_settings`: the chosen backend's `convert.<id>` block
    (its build options, e.g. a base built to take LoRA adapters: Backend.shape_export)."""
    config = check_input(model_dir)
    chosen = choose_backend(config, backend, precision, execution_provider)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    log_path = convert_log(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    try:
        result = chosen.export(model_dir, tmp, precision, execution_provider, log_path)
        if engine_settings and chosen.settings_model is not None:
            result.notes.extend(chosen.shape_export(tmp, chosen.settings_model.model_validate(engine_settings)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elapsed = time.perf_counter() - started
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    outputs = ConvertOutputs(model=out_dir.name, precision=base_precision(precision), backend=chosen.id,
                             execution_provider=execution_provider, versions=result.versions, files=list_files(out_dir),
                             tokenizer_parity=result.tokenizer_parity, notes=result.notes, wall_time_s=elapsed)
    outputs._out_dir = out_dir
    return outputs


def convert_log(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".convert.log")


def check_input(model_dir: Path) -> dict[str, Any]:
    """Refuse a bad checkpoint before any tool runs; return config.json."""
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: no such checkpoint folder", hint="pass the merged checkpoint folder")
    config = read_config(model_dir)
    refuse_pickles(model_dir)
    weight_files(model_dir)
    if has_adapter(model_dir):
        raise InputError(
            f"{model_dir.name}: holds an unmerged adapter (adapter_config.json)",
            hint="merge the adapter first (merge stage); convert exports the merged weights only",
        )
    return config


def list_files(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


class ConvertInputs(StageInputs):
    upstream: str = Field(description="fingerprint of the stage that produced the checkpoint")
    precision: str
    backend: str = AUTO
    execution_provider: str = "cpu"
    checkpoint: Path = location()
    into: str = "model"
    # The backend's `convert.<id>` block where it shapes the build (part of the fingerprint: a LoRA-ready
    # build is another folder than a plain one).
    engine_settings: dict[str, Any] = Field(default_factory=dict)


class ConvertStage(Stage[ConvertInputs, ConvertOutputs]):
    """Build the serving folder at a precision (the fp32 build of it is the `reference`)."""

    name = "convert"
    result_type = ConvertOutputs

    def __init__(self, inputs: ConvertInputs, label: str | None = None) -> None:
        super().__init__(inputs)
        self._label = label or self.name

    @property
    def label(self) -> str:
        return self._label

    def run(self, out: Path) -> ConvertOutputs:
        i = self.inputs
        result = convert(i.checkpoint, output_folder(out, i.into), i.precision, backend=i.backend,
                         execution_provider=i.execution_provider, engine_settings=i.engine_settings)
        return result.model_copy(update={"model": i.into})  # relative to the stage folder, as the pipeline reads it

    def summary(self, result: ConvertOutputs) -> str:
        if self.label == "reference":
            return f"fp32 reference via {result.backend}"
        return f"{self.inputs.precision} via {result.backend}"


def backend_of(result: ConvertOutputs) -> Backend:
    return get_backend(result.backend)
