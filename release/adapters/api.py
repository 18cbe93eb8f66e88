"""`relctl promote RUN --onto MODEL@ALIAS`: the one function the CLI calls for an adapter release."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.adapters.policy import unsupported
from release.adapters.release import AdapterReport
from release.adapters.target import BaseTarget, parse_target
from release.core.errors import InputError, InputProblems
from release.core.progress import Progress

if TYPE_CHECKING:
    from release.config import ReleaseConfig


def promote_onto(run_id: str, onto: str, project_dir: Path, config_path: Path | None,
                 overrides: dict[str, Any], name: str | None, dry_run: bool, progress: Progress,
                 canary_server: str | None = None) -> AdapterReport:
    """Release run `run_id`'s LoRA adapter onto the base version `onto` names, unmerged (docs/adapters.md).
    Every input problem is found before any download: the target's spelling, release.yaml (and what of it an
    adapter release cannot carry out: release/adapters/policy.py), the signing key, the base by content
    digest."""
    from release.adapters.release import release_adapter  # noqa: PLC0415 - the pipeline: not for a bad --onto
    from release.config import config_path as resolve_config  # noqa: PLC0415
    from release.config import load_config  # noqa: PLC0415
    from release.pipeline.runner import work_dir_for  # noqa: PLC0415
    from release.registry.client import open_registry  # noqa: PLC0415
    from release.signing.keys import release_key, trusted_keys  # noqa: PLC0415

    parse_target(onto)
    config_path = resolve_config(project_dir, config_path)
    cfg = load_config(config_path, overrides)
    refused = unsupported(cfg)  # a gate, approval or comparison release.yaml asks for is never skipped
    if refused:
        raise InputProblems(refused)
    target = parse_target(cfg.adapter_onto(onto) or onto)
    if name is None and cfg.release.mode == "adapter":
        name = cfg.model  # release.yaml's model names the adapter in adapter mode (the schema refuses the base's)
    refuse_base_name(name, target)
    anchor = config_path.parent if config_path else project_dir
    signer = release_key(cfg.signing, anchor)
    trust = trusted_keys(cfg.signing, anchor)
    registry = open_registry(project_dir)
    work = work_dir_for(project_dir, run_id) / "adapter"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return release_adapter(registry, run_id, target, cfg, work, trust, signer, progress, name,
                           dry_run, canary_server, anchor)


def refuse_base_name(name: str | None, target: BaseTarget) -> None:
    """--model naming the base itself: the adapter would become a version of its base (exit 2)."""
    if name is not None and name == target.model:
        raise InputError(f"--model {name} is the base the adapter goes onto; an adapter is its own registered model",
                         hint=f"name it e.g. --model {name}-support, or leave --model out ({name}-EXPERIMENT)")


def adapter_overrides(cfg: ReleaseConfig, onto: str | None, model: str | None) -> dict[str, Any]:
    """release.yaml overrides under which `relctl check RUN [--onto BASE] [--model NAME]` runs the pre-flight
    promote runs with the same flags: with a base (--onto, or release.yaml's adapter mode), adapter mode onto
    it and the adapter's name as promote_onto takes it (--model, else release.yaml's model in adapter mode,
    else BASE-EXPERIMENT); without one, --model names the whole model. Bad input: exit 2, before the registry."""
    onto = cfg.adapter_onto(onto)  # --onto disagreeing with release.yaml's release.onto is refused
    if onto is None:
        return {"model": model} if model is not None else {}
    target = parse_target(onto)
    if model is None and cfg.release.mode == "adapter":
        model = cfg.model
    refuse_base_name(model, target)
    # (in merged mode release.yaml's model names a whole model, never the adapter: dropped, as promote does)
    return {"release.mode": "adapter", "release.onto": onto, "model": model}
