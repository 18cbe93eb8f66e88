"""Links into the MLflow UI, built from the tracking URI: absolute for a tracking server, relative
(`#/...`, as `make demo-ui` serves them) for the embedded store."""

from __future__ import annotations

from urllib.parse import quote

from release.registry.store import redact_uri


def ui_base(tracking_uri: str) -> str:
    # Links land in reports, model cards and JSON output: never with the URI's credentials.
    if tracking_uri.startswith(("http://", "https://")):
        return redact_uri(tracking_uri).rstrip("/") + "/"
    return ""


def version_link(tracking_uri: str, model: str, version: str) -> str:
    return f"{ui_base(tracking_uri)}#/models/{quote(model)}/versions/{version}"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(tracking_uri)}#/experiments/{experiment_id}/runs/{run_id}"


def logged_model_link(tracking_uri: str, experiment_id: str, model_id: str) -> str:
    """A LoggedModel's page: its metrics, and the model versions made from it."""
    return f"{ui_base(tracking_uri)}#/experiments/{experiment_id}/models/{model_id}"


def artifact_link(tracking_uri: str, experiment_id: str, run_id: str, path: str) -> str:
    """The run page with one artifact open (MLflow's runPageWithArtifact route)."""
    return f"{run_link(tracking_uri, experiment_id, run_id)}/artifactPath/{quote(path)}"


def model_uri(model: str, version: str) -> str:
    return f"models:/{model}/{version}"
