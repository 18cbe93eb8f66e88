"""`relctl promote RUN --onto MODEL@ALIAS`: the one function the CLI calls for an adapter release."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from release.adapters.policy import unsupported
from release.adapters.release import AdapterReport
from release.adapters.target import parse_target
from release.core.errors import InputError, InputProblems
from release.core.progress import Progress


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
    if name is not None and name == target.model:  # else the adapter would become a version of its base
        raise InputError(f"--model {name} is the base the adapter goes onto; an adapter is its own registered model",
                         hint=f"name it e.g. --model {name}-support, or leave --model out ({name}-EXPERIMENT)")
    anchor = config_path.parent if config_path else project_dir
    signer = release_key(cfg.signing, anchor)
    trust = trusted_keys(cfg.signing, anchor)
    registry = open_registry(project_dir)
    work = work_dir_for(project_dir, run_id) / "adapter"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return release_adapter(registry, run_id, target, cfg, work, trust, signer, progress, name,
                           dry_run, canary_server, anchor)
