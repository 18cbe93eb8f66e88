"""The MLflow UI links of a release report and its card: the release run, its plots and details, the
training run, the version and its LoggedModel, and the version it replaced or was compared with."""

from __future__ import annotations

from release.pipeline.report import (
    COMPARED,
    DETAILS_ARTIFACT,
    DETAILS_LINK,
    METRICS_LINK,
    PLOT_LINK,
    RELEASE_RUN_LINK,
    REPLACED,
    REPORT_ARTIFACT,
    REPORT_LINK,
    TRAINING_RUN_LINK,
    VERSION_LINK,
    ReleaseReport,
)
from release.registry import Registry, links
from release.registry.client import logged_model_id


def add_links(registry: Registry, report: ReleaseReport) -> None:
    """MLflow UI links for the report and the card (absolute for a server, relative for the embedded store)."""
    uri = registry.store.tracking_uri
    found: dict[str, str] = {}
    releases = registry.releases_experiment()
    if report.release_run:
        found[RELEASE_RUN_LINK] = links.run_link(uri, releases, report.release_run)
        found |= {PLOT_LINK + title: links.artifact_link(uri, releases, report.release_run, path)
                  for title, path in report.plots.items()}
        found[DETAILS_LINK] = links.artifact_link(uri, releases, report.release_run, DETAILS_ARTIFACT)
        found[REPORT_LINK] = links.artifact_link(uri, releases, report.release_run, REPORT_ARTIFACT)
    training = report.lineage.get("training", {})
    if training.get("experiment_id"):
        found[TRAINING_RUN_LINK] = links.run_link(uri, training["experiment_id"], report.training_run)
    if report.version:
        report.model_uri = links.model_uri(report.model, report.version)
        found[VERSION_LINK] = links.version_link(uri, report.model, report.version)
        model_id = logged_model_id(registry.get_version(report.model, report.version))
        if model_id:
            found[METRICS_LINK] = links.logged_model_link(uri, releases, model_id)
    replaced = (report.aliases.get("previous") or [None, None])[1]
    if replaced:
        found[REPLACED] = links.version_link(uri, report.model, replaced)
    elif report.production:
        found[COMPARED] = links.version_link(uri, report.model, report.production["version"])
    report.links = found
