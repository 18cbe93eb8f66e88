"""Links into the MLflow UI, built from the tracking URI: absolute for a tracking server, relative
(`#/...`, as `make demo-ui` serves them) for the embedded store."""

from __future__ import annotations

from urllib.parse import quote

from release.store import redact_uri


def ui_base(tracking_uri: str) -> str:
    # Links land in reports, model cards and JSON output: never with the URI's credentials.
    if tracking_uri.startswith(("http://", "https://")):
        return redact_uri(tracking_uri).rstrip("/") + "/"
    return ""


def version_link(tracking_uri: str, model: str, version: str) -> str:
    return f"{ui_base(tracking_uri)}#/models/{quote(model)}/versions/{version}"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(tracking_uri)}#/experiments/{experiment_id}/runs/{run_id}"


def model_uri(model: str, version: str) -> str:
    return f"models:/{model}/{version}"
