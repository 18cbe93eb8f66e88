"""Every MLflow tag name relctl writes or reads, in one place.

A model version carries a small, stable set of tags (documented in docs/registry.md; they change only with
a note there), so the registry UI's versions table stays readable and searches keep working:

    relctl.training_run_id          the training run the version was promoted from
    relctl.release_run_id           the latest release run that gated it: report, plots, every number
    relctl.release_runs             every release run of the version, oldest first; the first holds the package
    lineage.git_commit              the training code's commit
    relctl.precision                fp32 | fp16 | int8 | int4
    relctl.release_state            registering | released | registered | rejected | stopped
    relctl.serving_config_hash      identity of the serving configuration (X-Relctl-Serving-Config)
    relctl.package_manifest_sha256  sha256 of relctl-package.json as released: the integrity anchor
    relctl.package_content_sha256   sha256 over every served file's sha256: equal content, equal release
    relctl.rejected_reason          why a gate or the canary rejected it (rejected versions only)
    relctl.oci_digest               oci://HOST/REPO@sha256:... once `relctl publish` pushed it (pinned by digest)
    gate.<id>.status                pass | fail | skipped | underpowered (| stopped: a canary cut short), one per gate

Numbers are metrics, not tags: validation.<metric>, gate.<id>.<metric> and memory.<figure> are logged to
the release run and to the version's MLflow LoggedModel (shown on the version page). The full lineage
(data, weights and adapter sha256s, config hash, release repo commit, exporter versions) is tagged on the
release run, beside the report.

on a registered model
    relctl.history.<utc>.<nonce>  one alias move (JSON), relctl's alias history
    relctl.server.<id>            a running `relctl serve BASE --adapters` of this base (JSON, its heartbeat;
                                  release/registry/servers.py)
on a release run
    relctl.model, relctl.training_run_id, relctl.outcome, relctl.pid, relctl.host, relctl.proc_start,
    lineage.*, relctl.exporter.*, gate.<id>.status
"""

from __future__ import annotations

from typing import TypeVar

from release.core.package import LEGACY_BACKEND

V = TypeVar("V")

# Model version
TRAINING_RUN = "relctl.training_run_id"
RELEASE_RUN = "relctl.release_run_id"
RELEASE_RUNS = "relctl.release_runs"          # comma-separated, oldest first (re-gates append)
PRECISION = "relctl.precision"
BACKEND = "relctl.backend"                 # the serving engine that built and serves the package
SERVING_CONFIG_HASH = "relctl.serving_config_hash"
PACKAGE_URI = "relctl.package_uri"          # versions before schema 3; now derived from the release run
MANIFEST_SHA256 = "relctl.package_manifest_sha256"
CONTENT_SHA256 = "relctl.package_content_sha256"
RELEASE_STATE = "relctl.release_state"
REJECTED_REASON = "relctl.rejected_reason"
OCI_DIGEST = "relctl.oci_digest"            # oci://HOST/REPO@sha256:... of the published package
EXPORTER_PREFIX = "relctl.exporter."
# Adapters as release units (release/adapters/, docs/adapters.md). Every version records the base digest of
# the weights it was built from (release/core/weights_digest.py) and, when an adapter was merged into them,
# that adapter's digest; an adapter version names the base version it was built and validated for.
BASE_SHA256 = "relctl.base_sha256"
MERGED_ADAPTER_SHA256 = "relctl.merged_adapter_sha256"
KIND = "relctl.kind"                        # "adapter" on an adapter version (absent: a whole model)
BASE_MODEL = "relctl.base_model"
BASE_VERSION = "relctl.base_version"
ADAPTER_SHA256 = "relctl.adapter_sha256"

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
SERVER_PREFIX = "relctl.server."             # a running server of this base records itself (registry/servers.py)

# Release run
MODEL = "relctl.model"
OUTCOME = "relctl.outcome"
PID = "relctl.pid"
HOST = "relctl.host"
PROC_START = "relctl.proc_start"
NOTE = "mlflow.note.content"

# Training run (written by the training code, read by intake)
TRAINING_GIT_COMMIT = "mlflow.source.git.commit"
TRAINING_BASE_SHA256 = "relctl.base_sha256"  # the base digest of the weights the run trained on
TRAINING_GIT_DIRTY = "git.dirty"
DATASET_CONTEXT = "mlflow.data.context"


# An approval (relctl approve, release/signing/approval.py): the signed statement, its signature by the
# release key (none when no key is configured), and the production version the gates compared with.
APPROVAL = "relctl.approval"
APPROVAL_SIGNATURE = "relctl.approval_signature"
GATED_AGAINST = "relctl.gated_against"
# Signing (release/signing): who signed the package ("unsigned" under `signing: off`; what status and the card
# say, never what verification trusts), and `relctl publish`'s signed record binding the OCI digest to the version.
SIGNED_BY = "relctl.signed_by"
OCI_RECORD = "relctl.oci_record"
OCI_RECORD_SIGNATURE = "relctl.oci_record_signature"

# The stable version tags (gate statuses aside); Registry refuses to write any other tag on a version.
VERSION_TAGS = frozenset({TRAINING_RUN, RELEASE_RUN, RELEASE_RUNS, GIT_COMMIT, PRECISION, BACKEND, RELEASE_STATE,
                          SERVING_CONFIG_HASH, MANIFEST_SHA256, CONTENT_SHA256, REJECTED_REASON, APPROVAL,
                          APPROVAL_SIGNATURE, GATED_AGAINST, OCI_DIGEST, SIGNED_BY, OCI_RECORD,
                          OCI_RECORD_SIGNATURE, BASE_SHA256, MERGED_ADAPTER_SHA256, KIND, BASE_MODEL,
                          BASE_VERSION, ADAPTER_SHA256})
MEMORY_PREFIX = "memory."
TAG_VALUE_MAX = 5000                        # MLflow's limit on a tag value


def is_version_tag(key: str) -> bool:
    """One of the documented tags of a model version."""
    return key in VERSION_TAGS or (key.startswith(GATE_PREFIX) and key.endswith(STATUS_SUFFIX)
                                   and key.count(".") == 2)


def gate_status(gate_id: str) -> str:
    return f"{GATE_PREFIX}{gate_id}{STATUS_SUFFIX}"


def gate_metric(gate_id: str, metric: str) -> str:
    return f"{GATE_PREFIX}{gate_id}.{metric}"


def engine_of(tags: dict[str, str]) -> str:
    """The serving engine (backend id) of a version. Versions released before backends were named were all
    packages of release.core.package.LEGACY_BACKEND."""
    return tags.get(BACKEND) or LEGACY_BACKEND


def engine_label(tags: dict[str, str]) -> str:
    """A version's serving engine and precision as people read them: "ENGINE PRECISION"."""
    return f"{engine_of(tags)} {tags.get(PRECISION) or 'unknown precision'}"


def gate_statuses(tags: dict[str, str]) -> dict[str, str]:
    """{gate id: status} from a version's tags."""
    return {k.removeprefix(GATE_PREFIX).removesuffix(STATUS_SUFFIX): v for k, v in tags.items()
            if k.startswith(GATE_PREFIX) and k.endswith(STATUS_SUFFIX)}


def with_prefix(tags: dict[str, V], prefix: str) -> dict[str, V]:
    """The tags under `prefix`, keyed without it."""
    return {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)}


def release_runs(tags: dict[str, str]) -> list[str]:
    """Every release run of a version, oldest first: the one that registered its package, then each that
    gated it again. Versions from before the history was kept name one run."""
    listed = [r for r in tags.get(RELEASE_RUNS, "").split(",") if r]
    if listed:
        return listed
    return [tags[RELEASE_RUN]] if tags.get(RELEASE_RUN) else []


def with_release_run(tags: dict[str, str], run_id: str) -> str:
    """The RELEASE_RUNS value once `run_id` gated the version again: appended, within a tag's length (the first
    run, which holds the package, is always kept; the oldest re-gates make room)."""
    runs = [r for r in release_runs(tags) if r != run_id] + [run_id]
    while len(",".join(runs)) > TAG_VALUE_MAX and len(runs) > 2:
        del runs[1]
    return ",".join(runs)
