"""Intake: fetch a training run's checkpoint and check it before anything loads it; record lineage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from release.core import checkpoint as ckpt
from release.core.errors import InputError
from release.core.jsonfile import read_json_file
from release.core.numerics import fp16_overflows, tensor_max_abs
from release.lora.settings import read_settings
from release.registry import Registry
from release.stages.base import Stage, StageInputs, StageResult
from release.stages.lineage import checkpoint_lineage, training_lineage

# Optional files the example (and any run that follows the layout) logs beside the checkpoint.
PROMPTS_ARTIFACT = "validation/prompts.jsonl"
EVAL_ARTIFACT = "data/eval.jsonl"


def check_checkpoint(folder: Path) -> dict[str, Any]:
    """Every defect a loader could misread is refused here, reading headers and JSON only."""
    ckpt.refuse_pickles(folder)
    config = ckpt.read_config(folder)
    ckpt.check_config_fields(config)
    check_tokenizer(folder)
    files = ckpt.weight_files(folder)
    headers = {path: ckpt.read_header(path) for path in files}
    ckpt.check_index(folder, headers)
    summary: dict[str, Any] = {
        "model_type": config["model_type"],
        "architectures": config.get("architectures", []),
        "weight_files": [p.name for p in files],
        "tensors": sum(len(h.tensors) for h in headers.values()),
        "weight_bytes": sum(t.nbytes for h in headers.values() for t in h.tensors.values()),
        "dtypes": sorted({t.dtype for h in headers.values() for t in h.tensors.values()}),
        "adapter": None,
    }
    if ckpt.has_adapter(folder):
        summary["adapter"] = _check_adapter(folder)
    return summary


def check_tokenizer(folder: Path) -> None:
    """tokenizer.json must parse as a `tokenizers` tokenizer: a broken one otherwise fails the builder."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return  # the run contract names a missing tokenizer.json; a local checkpoint may use another format
    from release.core.tokenizer_file import load_tokenizer  # noqa: PLC0415 - only when a checkpoint is checked

    load_tokenizer(path, f"{folder.name}/tokenizer.json")


def _check_adapter(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "adapter_config.json"
    adapter_cfg = read_json_file(cfg_path, InputError(f"{folder.name}: adapter_config.json is missing"),
                                 fix_hint="re-save the adapter")
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise InputError(
            f"{folder.name}: adapter_config.json has no adapter_model.safetensors beside it",
            hint="save the adapter with save_pretrained(..., safe_serialization=True)",
        )
    read_settings(folder)  # an option or number the merge would refuse (lora_alpha NaN, ...) is refused now
    header = ckpt.read_header(weights)
    return {
        "peft_type": adapter_cfg.get("peft_type"),
        "r": adapter_cfg.get("r"),
        "lora_alpha": adapter_cfg.get("lora_alpha"),
        "target_modules": adapter_cfg.get("target_modules"),
        "tensors": len(header.tensors),
    }


class AdapterSummary(StageResult):
    peft_type: str | None
    r: int | None
    lora_alpha: float | None
    target_modules: list[str] | str | None
    tensors: int


class CheckpointSummary(StageResult):
    model_type: str
    architectures: list[str]
    weight_files: list[str]
    tensors: int
    weight_bytes: int
    dtypes: list[str]
    adapter: AdapterSummary | None


class IntakeInputs(StageInputs):
    run_id: str
    artifact_path: str = "checkpoint"


class IntakeResult(StageResult):
    checkpoint: str
    prompts: str | None
    eval_data: str | None
    summary: CheckpointSummary
    lineage: dict[str, Any]
    # Tensors with values beyond fp16's range (they would become Inf in an fp16 build).
    fp16_overflow: list[str] = Field(default_factory=list)


class IntakeStage(Stage[IntakeInputs, IntakeResult]):
    """Download the run's checkpoint (and optional prompts/eval set), check it unloaded, record lineage."""

    name = "intake"
    result_type = IntakeResult

    def __init__(self, inputs: IntakeInputs, registry: Registry) -> None:
        super().__init__(inputs)
        self.registry = registry

    def run(self, out: Path) -> IntakeResult:
        run = self.registry.get_run(self.inputs.run_id)
        fetched = fetch_artifacts(self.registry, run.run_id, self.inputs.artifact_path, out)
        folder = out / str(fetched["checkpoint"])
        summary = CheckpointSummary.model_validate(check_checkpoint(folder))
        adapter = [folder / "adapter_model.safetensors"] if summary.adapter else []
        max_abs = tensor_max_abs([*ckpt.weight_files(folder), *adapter])  # refuses NaN/Inf, naming the tensor
        lineage = {"training": training_lineage(run),
                   "checkpoint": checkpoint_lineage(folder, ckpt.weight_files(folder))}
        return IntakeResult(checkpoint=str(fetched["checkpoint"]), prompts=fetched["prompts"],
                            eval_data=fetched["eval_data"], summary=summary, lineage=lineage,
                            fp16_overflow=fp16_overflows(max_abs))

    def summary(self, result: IntakeResult) -> str:
        s = result.summary
        extra = f", {s.adapter.peft_type} adapter r={s.adapter.r}" if s.adapter else ", no adapter"
        return f"{s.model_type} checkpoint, {s.tensors} tensors, {s.weight_bytes / 1e6:.1f} MB{extra}"


def fetch_artifacts(registry: Registry, run_id: str, artifact_path: str, dest: Path) -> dict[str, str | None]:
    """Download the checkpoint folder (required) and the optional prompts/eval files into `dest`."""
    listed = registry.list_artifacts(run_id, artifact_path)
    if not listed:
        raise InputError(
            f"run '{run_id}' has no checkpoint at artifact path '{artifact_path}/'",
            hint=f"log it with mlflow.log_artifacts(checkpoint_dir, '{artifact_path}') "
            "or set source.artifact_path in release.yaml",
        )
    out: dict[str, str | None] = {"checkpoint": _download(registry, run_id, artifact_path, dest)}
    for key, path in (("prompts", PROMPTS_ARTIFACT), ("eval_data", EVAL_ARTIFACT)):
        parent = path.rsplit("/", 1)[0]
        out[key] = _download(registry, run_id, path, dest) if path in registry.list_artifacts(run_id, parent) else None
    return out


def _download(registry: Registry, run_id: str, path: str, dest: Path) -> str:
    local = registry.download_run_artifact(run_id, path, dest)
    return local.relative_to(dest.resolve()).as_posix()
