"""An adapter release under a canary (docs/adapters.md, docs/canary.md), following promote's convention: when
release.yaml configures `gates.canary` and the adapter already has a production version, the new version is
registered as `candidate` (production unmoved) and judged against production on the one base server that
serves them (`--server URL`); the canary's outcome moves the aliases. A first release has nothing to canary
against and is released at once, as promote's canary gate is skipped then.

Everything the canary needs is checked before the first download: the server's URL and admin key, that
it runs the base version this release targets (production's signed package bound to it), and that it
serves the adapter's production version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.config import ReleaseConfig
from release.core.errors import ConfigError, InputError
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.records import VersionRecord

if TYPE_CHECKING:  # scipy (the judge), aiohttp and the router: only for a release that runs a canary
    from release.canary.settings import CanaryConfig
    from release.signing.keys import Trust


@dataclass(frozen=True)
class CanaryPlan:
    config: CanaryConfig
    server: str
    production: VersionRecord
    base_dir: Path | None    # where gates.canary.traffic.dataset is read relative to
    trust: Trust             # the release's trusted keys: both arms' packages are verified against them


def plan_canary(registry: Registry, model: str, cfg: ReleaseConfig, server: str | None, base: tuple[str, str],
                config_dir: Path | None) -> CanaryPlan | None:
    """The canary this release runs (None: released at once); InputError (exit 2) for what cannot work."""
    from pydantic import ValidationError  # noqa: PLC0415

    from release.canary.adapter_mode import adapter_arms  # noqa: PLC0415
    from release.canary.settings import CanaryConfig  # noqa: PLC0415

    if "canary" not in cfg.gates:
        if server is not None:
            raise InputError("--server: runs the adapter's canary, but release.yaml configures no gates.canary",
                             hint="add a gates.canary block (docs/canary.md), or drop --server")
        return None
    production = registry.version_for(model, PRODUCTION) if registry.model_exists(model) else None
    if production is None:
        if "canary" in cfg.require:  # required gates must pass, not skip (as promote's do)
            raise InputError(f"require: canary, but {model} has no production version to canary against (its "
                             "first release)", hint="release the first version without canary in require")
        return None
    try:
        config = CanaryConfig.model_validate(cfg.gates["canary"])
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"gates.canary.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}",
                          hint="see docs/canary.md for the block's fields") from exc
    dataset = config.traffic.dataset
    if dataset is not None and not ((config_dir or Path(".")) / dataset).is_file():
        raise InputError(f"gates.canary.traffic.dataset {dataset}: no such file (relative to {config_dir or '.'})",
                         hint="point it at a JSONL of prompts, or drop it for synthetic prompts")
    built = (production.tags.get(T.BASE_MODEL), production.tags.get(T.BASE_VERSION))
    if built != base:
        raise InputError(f"{model}'s production v{production.version} serves on {built[0]} v{built[1]}, this release "
                         f"targets {base[0]} v{base[1]}: a canary compares two versions on one base",
                         hint=f"release onto {built[0]}/{built[1]}, or drop gates.canary for this release")
    from release.signing.keys import trusted_keys  # noqa: PLC0415 - as the release itself reads them

    trust = trusted_keys(cfg.signing, config_dir or Path("."))
    # the server, its admin key, the base it runs (production's signed package bound to it), what it serves now
    adapter_arms(server, model, production, production, registry, trust)
    assert server is not None
    return CanaryPlan(config, server, production, config_dir, trust)


def run_release_canary(registry: Registry, plan: CanaryPlan, model: str, version: str, work: Path,
                       release_run: str, say: Any) -> dict[str, Any]:
    """Judge `model` v`version` (registered as `candidate` by this release) against production on the base
    server; the aliases move at the outcome. The gate-shaped report (evidence under `work`)."""
    from release.canary.adapter_mode import adapter_arms  # noqa: PLC0415
    from release.canary.cli import finish_report  # noqa: PLC0415
    from release.canary.registry_mode import adapter_canary  # noqa: PLC0415

    arms = adapter_arms(plan.server, model, plan.production, registry.get_version(model, version), registry,
                        plan.trust)
    result, extra = adapter_canary(registry, arms, False, plan.config, work, plan.base_dir, say, release_run)
    return {"outcome": result.outcome, "passed": result.passed, **finish_report(result, work, extra)}
