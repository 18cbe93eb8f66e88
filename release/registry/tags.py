"""Every MLflow tag name relctl writes or reads, in one place.

Stable names (the registry UI, `relctl status`, `relctl trace` and users' own searches rely on them;
they change only with a note in the README):

on a model version
    relctl.training_run_id        the training run the version was promoted from
    relctl.release_run_id         the release run holding the report, package and evidence
    relctl.precision              fp32 | fp16 | int8 | int4
    relctl.serving_config_hash    identity of the serving configuration (returned in X-Relctl-Serving-Config)
    relctl.package_uri            where the package lives (runs:/<release run>/package)
    relctl.package_manifest_sha256  sha256 of relctl-package.json as released: the integrity anchor
    relctl.package_content_sha256   sha256 over every served file's sha256: equal content, equal release
    relctl.release_state          registering | released | registered | rejected
    lineage.git_commit, lineage.git_dirty, lineage.config_sha256, lineage.release_repo_commit,
    lineage.release_repo_dirty, lineage.data.<name>.sha256, lineage.weights.<file>.sha256,
    lineage.adapter.<file>.sha256
    gate.<id>.status              pass | fail | skipped;  gate.<id>.<metric>: that gate's numbers
    validation.<metric>           quality against the fp32 reference
on a registered model
    relctl.history.<utc>.<nonce>  one alias move (JSON), relctl's alias history
on a release run
    relctl.model, relctl.training_run_id, relctl.outcome, relctl.pid, relctl.host, relctl.proc_start
"""

from __future__ import annotations

# Model version
TRAINING_RUN = "relctl.training_run_id"
RELEASE_RUN = "relctl.release_run_id"
PRECISION = "relctl.precision"
SERVING_CONFIG_HASH = "relctl.serving_config_hash"
PACKAGE_URI = "relctl.package_uri"
MANIFEST_SHA256 = "relctl.package_manifest_sha256"
CONTENT_SHA256 = "relctl.package_content_sha256"
RELEASE_STATE = "relctl.release_state"
GATES_NOTE = "relctl.gates"
REJECTED_REASON = "relctl.rejected_reason"
REJECTED = "relctl.rejected"                # `relctl canary MODEL`: why the canary rejected the version
CANARY = "relctl.canary"                    # `relctl canary MODEL`: the canary's outcome and reason
EXPORTER_PREFIX = "relctl.exporter."

GIT_COMMIT = "lineage.git_commit"
GIT_DIRTY = "lineage.git_dirty"
CONFIG_SHA256 = "lineage.config_sha256"
RELEASE_REPO_COMMIT = "lineage.release_repo_commit"
RELEASE_REPO_DIRTY = "lineage.release_repo_dirty"
DATA_PREFIX = "lineage.data."
WEIGHTS_PREFIX = "lineage.weights."
ADAPTER_PREFIX = "lineage.adapter."
SHA256_SUFFIX = ".sha256"

GATE_PREFIX = "gate."
STATUS_SUFFIX = ".status"
VALIDATION_PREFIX = "validation."

# Registered model
HISTORY_PREFIX = "relctl.history."

# Release run
MODEL = "relctl.model"
OUTCOME = "relctl.outcome"
PID = "relctl.pid"
HOST = "relctl.host"
PROC_START = "relctl.proc_start"
NOTE = "mlflow.note.content"

# Training run (written by the training code, read by intake)
TRAINING_GIT_COMMIT = "mlflow.source.git.commit"
TRAINING_GIT_DIRTY = "git.dirty"
DATASET_CONTEXT = "mlflow.data.context"


def gate_status(gate_id: str) -> str:
    return f"{GATE_PREFIX}{gate_id}{STATUS_SUFFIX}"


def gate_metric(gate_id: str, metric: str) -> str:
    return f"{GATE_PREFIX}{gate_id}.{metric}"


def gate_statuses(tags: dict[str, str]) -> dict[str, str]:
    """{gate id: status} from a version's tags."""
    return {k.removeprefix(GATE_PREFIX).removesuffix(STATUS_SUFFIX): v for k, v in tags.items()
            if k.startswith(GATE_PREFIX) and k.endswith(STATUS_SUFFIX)}


def with_prefix(tags: dict[str, str], prefix: str) -> dict[str, str]:
    """The tags under `prefix`, keyed without it."""
    return {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)}
