"""One function per command. The CLI parses and prints; everything it does happens here."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from release.config import CONFIG_FILE, load_config
from release.errors import InputError, RegistryError
from release.progress import Progress
from release.promote import Promotion
from release.registry import PREVIOUS, PRODUCTION, AliasMove, Registry
from release.report import ReleaseReport
from release.store import connect, resolve_store
from release.versions import fetch_package


def open_registry(project_dir: Path) -> Registry:
    store = resolve_store(project_dir)
    connect(store)
    return Registry(store)


def promote(
    run_id: str,
    project_dir: Path,
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    summary_path: Path | None = None,
) -> ReleaseReport:
    """Promote training run `run_id`; raises Blocked (exit 1) when validation or a gate refuses it.

    With `summary_path`, a markdown summary is appended there whatever the outcome (CI job summaries).
    """
    if config_path is None and (project_dir / CONFIG_FILE).is_file():
        config_path = project_dir / CONFIG_FILE
    cfg = load_config(config_path, overrides)
    store = resolve_store(project_dir)
    connect(store)
    promotion = Promotion(cfg, store, project_dir, config_path, progress or Progress(quiet=True))
    return promotion.run(run_id, dry_run=dry_run, summary_path=summary_path)


def rollback(model: str, project_dir: Path, reason: str, to_version: str | None = None) -> AliasMove:
    """Point `production` back at the version it replaced (or `to_version`), after verifying its package."""
    registry = open_registry(project_dir)
    registry.require_model(model)
    aliases = registry.aliases(model)
    target = to_version or aliases.get(PREVIOUS)
    if target is None:
        raise InputError(
            f"{model}: no '{PREVIOUS}' alias, so there is nothing to roll back to",
            hint="pass --to VERSION to choose a version explicitly",
        )
    if target == aliases.get(PRODUCTION):
        raise InputError(f"{model}: production already is v{target}", hint="pass --to VERSION for another version")
    with tempfile.TemporaryDirectory() as tmp:
        fetch_package(registry, model, target, Path(tmp))  # refuses a package whose checksums differ
    # The new `previous` is whatever the target replaced when it was promoted (none: no previous).
    replaced = registry.replaced_by(model, target)
    return registry.move_aliases(
        model, {PRODUCTION: target, PREVIOUS: replaced}, "rollback", reason, release_run=None
    )


def register(package_dir: Path, model: str, project_dir: Path, production: bool = False) -> tuple[str, str]:
    """Register a package as a new version of `model` (checksums verified first); optionally production."""
    from release.promote import RELEASE_EXPERIMENT
    from release.stages.package import verify_package
    from release.stages.register import register_package
    from release.store import ensure_experiment

    package = verify_package(package_dir)
    registry = open_registry(project_dir)
    experiment_id = ensure_experiment(registry.store, RELEASE_EXPERIMENT)
    return register_package(registry, package, model, experiment_id, production)


def history(model: str, project_dir: Path) -> list[AliasMove]:
    registry = open_registry(project_dir)
    registry.require_model(model)
    return registry.history(model)


def status(model: str | None, project_dir: Path) -> dict[str, Any]:
    """Aliases → versions with lineage and gate summary; with no model, the registered models."""
    registry = open_registry(project_dir)
    if model is None:
        return {"models": registry.list_models()}
    registry.require_model(model)
    out: dict[str, Any] = {"model": model, "aliases": {}}
    for alias, version in sorted(registry.aliases(model).items()):
        try:
            mv = registry.get_version(model, version)
        except Exception as exc:  # an alias to a deleted version is worth showing, not crashing on
            raise RegistryError(f"{model}@{alias} points at v{version}, which cannot be read: {exc}") from exc
        tags = dict(mv.tags)
        out["aliases"][alias] = {
            "version": version,
            "created": mv.creation_timestamp,
            "training_run": tags.get("relctl.training_run_id"),
            "git_commit": tags.get("lineage.git_commit"),
            "precision": tags.get("relctl.precision"),
            "serving_config_hash": tags.get("relctl.serving_config_hash"),
            "data": {k: v for k, v in tags.items() if k.startswith("lineage.data.")},
            "gates": {k.removeprefix("gate.").removesuffix(".status"): v
                      for k, v in tags.items() if k.startswith("gate.") and k.endswith(".status")},
            "validation": {k.removeprefix("validation."): v for k, v in tags.items() if k.startswith("validation.")},
        }
    return out
