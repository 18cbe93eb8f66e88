"""The run contract: what a training run must log for relctl to release it, checked in seconds.

`relctl check RUN` and the first step of `relctl promote` read only the run's artifact listing and its
tags (nothing is downloaded), resolve every gate's configuration, and list every problem at once, each
with its fix. Required:
    checkpoint/                 (source.artifact_path) Hugging Face layout: config.json, *.safetensors
                                (+ model.safetensors.index.json when sharded), tokenizer.json; optional
                                PEFT adapter: adapter_config.json + adapter_model.safetensors
    validation/prompts.jsonl    {"prompt": ...} per line (or validation.prompts in release.yaml)
    data/eval.jsonl             {"prompt", "expected"} per line, when the eval gate runs without gates.eval.dataset
Recommended (a warning when missing): the git commit tag `mlflow.source.git.commit`, data digests
`data.<name>.sha256` (the lineage a regression is traced with).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Run

from release.checkpoint import PICKLE_SUFFIXES
from release.config import ReleaseConfig
from release.families import GENAI_ARCHITECTURES, architecture, genai_config_problems
from release.gating.contract import Gate, Problem, missing_file, preflight
from release.lora.base_name import BASE_NAME_HINT, check_base_names
from release.registry import Registry
from release.registry import tags as T
from release.stages.intake import EVAL_ARTIFACT, PROMPTS_ARTIFACT


@dataclass
class ContractReport:
    run_id: str
    run: Run | None = None            # the training run as read for the check (promote goes on with it)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    found: dict[str, bool] = field(default_factory=dict)


def check_run(registry: Registry, run_id: str, cfg: ReleaseConfig, gates: list[Gate],
              config_dir: Path | None) -> ContractReport:
    """Every problem with `run_id` and the release configuration, without downloading anything."""
    report = ContractReport(run_id)
    run = report.run = registry.get_run(run_id)  # a missing run is its own, single error
    ckpt = cfg.source.artifact_path
    files = {p.rsplit("/", 1)[-1] for p in registry.list_artifacts(run_id, ckpt)}
    report.found["checkpoint"] = bool(files)

    def need(ok: bool, message: str, hint: str) -> None:
        if not ok:
            report.problems.append(Problem(message, hint))

    if not files:
        need(False, f"run '{run_id}' has no checkpoint at artifact path '{ckpt}/'",
             f"log it with mlflow.log_artifacts(checkpoint_dir, '{ckpt}') or set source.artifact_path")
    else:
        need("config.json" in files, f"{ckpt}/config.json is missing",
             "log the model's config.json beside its weights (model.config.save_pretrained(dir))")
        weights = [f for f in files if f.endswith(".safetensors") and f != "adapter_model.safetensors"]
        pickles = sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))
        need(not pickles, f"{ckpt}/: pickle checkpoint files are not accepted ({', '.join(pickles[:3])})",
             "save with safetensors (save_pretrained(..., safe_serialization=True)); relctl never unpickles")
        need(bool(weights), f"{ckpt}/: no *.safetensors weights", "log the weights in Hugging Face layout")
        need("tokenizer.json" in files, f"{ckpt}/tokenizer.json is missing",
             "save the training tokenizer beside the weights (tokenizer.save_pretrained(dir))")
        if "adapter_config.json" in files:
            need("adapter_model.safetensors" in files, f"{ckpt}/adapter_config.json has no adapter_model.safetensors",
                 "save the adapter with save_pretrained(..., safe_serialization=True)")
        if "config.json" in files:
            _check_configs(registry, run_id, cfg, "adapter_config.json" in files, report)
    listed = {p for folder in ("validation", "data") for p in registry.list_artifacts(run_id, folder)}
    report.found["prompts"] = PROMPTS_ARTIFACT in listed
    if cfg.validation.prompts is None:
        need(PROMPTS_ARTIFACT in listed, f"run '{run_id}' has no validation prompts ({PROMPTS_ARTIFACT})",
             "log validation/prompts.jsonl with the run or set validation.prompts in release.yaml")
    else:
        found = missing_file("validation.prompts", cfg.validation.prompts, config_dir)
        if found:
            report.problems.append(found)
    report.found["eval_data"] = EVAL_ARTIFACT in listed
    eval_gate = next((g for g in gates if g.id == "eval"), None)
    if eval_gate is not None and getattr(getattr(eval_gate, "config", None), "dataset", "") is None:
        need(EVAL_ARTIFACT in listed, f"the eval gate needs an eval set: run '{run_id}' has no {EVAL_ARTIFACT}",
             "log data/eval.jsonl with the run or set gates.eval.dataset in release.yaml")
    report.problems += [p for gate in gates for p in preflight(gate, config_dir)]
    tags = run.data.tags
    if T.TRAINING_GIT_COMMIT not in tags:
        report.warnings.append(f"run '{run_id}' has no {T.TRAINING_GIT_COMMIT} tag: the release cannot be "
                               "traced to its code (log from a git checkout, or set the tag)")
    if not any(k.startswith("data.") and k.endswith(".sha256") for k in tags):
        report.warnings.append(f"run '{run_id}' records no data digests (data.<name>.sha256): the release "
                               "cannot be traced to its data")
    return report



def _check_configs(registry: Registry, run_id: str, cfg: ReleaseConfig, adapter: bool, report: ContractReport) -> None:
    """What config.json (and adapter_config.json) say, read in a second: a model the exporter cannot build,
    an adapter recorded for another base."""
    ckpt = cfg.source.artifact_path
    names = ["config.json", *(["adapter_config.json"] if adapter else [])]
    with tempfile.TemporaryDirectory(prefix="relctl-check-") as tmp:
        loaded = {name: _json(registry.download_run_artifact(run_id, f"{ckpt}/{name}", Path(tmp))) for name in names}
    config = loaded["config.json"]
    if config is None:
        report.problems.append(Problem(f"{ckpt}/config.json is not a JSON object", "re-save the model's config"))
        return
    exporter = cfg.convert.exporter
    if exporter == "genai" or (exporter == "auto" and architecture(config) in GENAI_ARCHITECTURES):
        for reason in genai_config_problems(config):
            report.problems.append(Problem(f"{ckpt}/config.json: onnxruntime-genai's model builder cannot build "
                                           f"this model: {reason}",
                                           "change the config as the reason says, or set convert.exporter: torch"))
    adapter_config = loaded.get("adapter_config.json")
    if adapter_config is not None:
        check = check_base_names(adapter_config, config)
        if check.error:
            report.problems.append(Problem(f"{ckpt}/{check.error}", BASE_NAME_HINT))
        elif check.warning:
            report.warnings.append(check.warning)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
