"""Intake: fetch a training run's checkpoint and check it before anything loads it; record lineage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.artifacts
from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from release import checkpoint as ckpt
from release.errors import InputError, RegistryError
from release.jsonfile import read_json_file
from release.lineage import checkpoint_lineage, training_lineage
from release.registry import Registry

# Optional files the example (and any run that follows the layout) logs beside the checkpoint.
PROMPTS_ARTIFACT = "validation/prompts.jsonl"
EVAL_ARTIFACT = "data/eval.jsonl"


def check_checkpoint(folder: Path) -> dict[str, Any]:
    """Every defect a loader could misread is refused here, reading headers and JSON only."""
    ckpt.refuse_pickles(folder)
    config = ckpt.read_config(folder)
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
    header = ckpt.read_header(weights)
    return {
        "peft_type": adapter_cfg.get("peft_type"),
        "r": adapter_cfg.get("r"),
        "lora_alpha": adapter_cfg.get("lora_alpha"),
        "target_modules": adapter_cfg.get("target_modules"),
        "tensors": len(header.tensors),
    }


def fetch_artifacts(registry: Registry, run: Run, artifact_path: str, dest: Path) -> dict[str, str | None]:
    """Download the checkpoint folder (required) and the optional prompts/eval files into `dest`."""
    run_id = run.info.run_id
    try:
        listed = registry.client.list_artifacts(run_id, artifact_path)
    except MlflowException as exc:
        raise RegistryError(f"cannot list artifacts of run '{run_id}': {exc.message}") from exc
    if not listed:
        raise InputError(
            f"run '{run_id}' has no checkpoint at artifact path '{artifact_path}/'",
            hint=f"log it with mlflow.log_artifacts(checkpoint_dir, '{artifact_path}') "
            "or set source.artifact_path in release.yaml",
        )
    out: dict[str, str | None] = {"checkpoint": _download(registry, run_id, artifact_path, dest)}
    for key, path in (("prompts", PROMPTS_ARTIFACT), ("eval_data", EVAL_ARTIFACT)):
        parent = path.rsplit("/", 1)[0]
        names = {a.path for a in registry.client.list_artifacts(run_id, parent)}
        out[key] = _download(registry, run_id, path, dest) if path in names else None
    return out


def _download(registry: Registry, run_id: str, path: str, dest: Path) -> str:
    local = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=path, dst_path=str(dest), tracking_uri=registry.store.tracking_uri
    )
    return Path(local).relative_to(dest.resolve()).as_posix()


def run_intake(registry: Registry, run: Run, artifact_path: str, stage_dir: Path) -> dict[str, Any]:
    fetched = fetch_artifacts(registry, run, artifact_path, stage_dir)
    folder = stage_dir / str(fetched["checkpoint"])
    summary = check_checkpoint(folder)
    lineage = {
        "training": training_lineage(run),
        "checkpoint": checkpoint_lineage(folder, ckpt.weight_files(folder)),
    }
    return {**fetched, "summary": summary, "lineage": lineage}
