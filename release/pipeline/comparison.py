"""The engines comparison inside one promote: each entry of release.yaml's `engines:` built by the release's
own stages (release/pipeline/builds.py) for a configuration of its own, passed explicitly, load-tested by
the load gate, tabulated (release/pipeline/engines.py), and with `convert.backend: auto` the engine the
release goes on with chosen.

The release's configuration is never changed in place: `engine_config` derives one per entry, and the
caller receives the configuration to release with (its own, or auto's choice) as a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from release.backends import Backend, get_backend
from release.config import EngineConfig, ReleaseConfig
from release.core.errors import Blocked
from release.core.progress import Progress
from release.gating.contract import Gate, GateContext
from release.gating.reference import cache_dir_of
from release.pipeline.builds import Builds
from release.pipeline.engines import Comparison, EngineBuild, decide
from release.pipeline.precision_search import measure
from release.pipeline.report import ReleaseReport


def engine_config(cfg: ReleaseConfig, backend: str, precision: str) -> ReleaseConfig:
    """`cfg` with convert set to one engine and precision; everything else (gates, serving, ...) unchanged."""
    convert = cfg.convert.model_copy(update={"backend": backend, "precision": precision})
    return cfg.model_copy(update={"convert": convert})


@dataclass(frozen=True)
class Compared:
    comparison: Comparison
    cfg: ReleaseConfig      # what the release goes on with: auto's choice, else the caller's own
    backend: Backend


def compare_in_release(cfg: ReleaseConfig, builds: Builds, name: str, report: ReleaseReport, gates: list[Gate],
                       backend: Backend, progress: Progress) -> Compared:
    """Each entry of engines: built by this release's own stages (so the one released resumes from the same
    folders) and load-tested by the load gate; the table goes into `report.engines` whether or not an engine
    qualified. Released next: the cheapest that met quality and the SLOs under convert.backend: auto (Blocked
    when none did), else `cfg` and `backend` as they are."""

    def build(entry: EngineConfig) -> EngineBuild:
        own = engine_config(cfg, entry.backend, entry.precision)
        reference, candidate = builds.convert(own, get_backend(entry.backend))
        validation = builds.validate(own, reference, candidate)
        verdict = validation.result.model_dump(mode="json")
        if not validation.result.passed:
            return EngineBuild(verdict)
        memory = builds.memory(own, candidate).result.estimate
        # The same package fields as the release's own: the engine taken resumes this folder.
        scratch = ReleaseReport(model=name, training_run=report.training_run, release_run=None,
                                precision=entry.precision, lineage=report.lineage, validation=verdict)
        package = builds.package(own, name, scratch, candidate, validation)
        return EngineBuild(verdict, package.root, memory, scratch.package.get("content_sha256"))

    def context(entry: EngineConfig, package_dir: Path) -> GateContext:
        work = builds.intake.dir.parent / "engines" / f"{entry.backend}-{entry.precision}" / "load"
        return GateContext(model_name=name, package_dir=package_dir, work_dir=work, production=None,
                           config_dir=builds.config_dir)

    intake = builds.intake
    judging = GateContext(model_name=name, package_dir=builds.checkpoint, work_dir=intake.dir.parent / "precision",
                          production=None, config_dir=builds.config_dir,
                          eval_dataset=intake.path(intake.result.eval_data) if intake.result.eval_data else None)
    comparison = measure(cfg, gates, build, context, progress, builds.checkpoint, judging,  # precision: auto too
                         cache_dir_of(intake.dir.parent))
    try:
        chosen = decide(comparison, cfg)
    except Blocked as exc:
        report.block([exc.message])
        raise
    finally:  # the table, with each row's reason, whether or not an engine qualified
        report.engines = comparison.to_dict()
    if comparison.selection != "auto" or chosen is None:
        return Compared(comparison, cfg, backend)
    report.precision = chosen.precision
    report.engine = {"backend": chosen.engine, "precision": chosen.precision,
                     "why": f"convert.backend: auto, {comparison.why[0]}"}
    progress.info(f"engine: {chosen.engine} {chosen.precision} (convert.backend: auto, {comparison.why[0]})")
    return Compared(comparison, engine_config(cfg, chosen.engine, chosen.precision), get_backend(chosen.engine))
