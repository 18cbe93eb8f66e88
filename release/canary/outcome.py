"""The registry's side of a finished canary: one alias move, recorded in relctl's history.

pass    production -> candidate, previous -> the old production, candidate removed (one history entry)
fail    candidate removed, the version tagged rejected with the reason; production never moves
stopped (e.g. a rollback won) candidate removed, the version tagged with why; production left as it is
"""

from __future__ import annotations

from release.canary.runner import CanaryResult
from release.registry import CANDIDATE, PREVIOUS, PRODUCTION, AliasMove, Registry

REJECTED_TAG = "relctl.rejected"
CANARY_TAG = "relctl.canary"


def finish_canary(registry: Registry, model: str, candidate_version: str, production_version: str,
                  result: CanaryResult, release_run: str | None = None) -> AliasMove | None:
    """Move the aliases for the canary's outcome; returns the recorded move (None if nothing changed).

    A pass only promotes while production still is `production_version`: if it moved during the canary
    (a rollback), the rollback wins and the candidate is only un-aliased.
    """
    current = registry.aliases(model).get(PRODUCTION)
    if result.passed and current == production_version:
        registry.set_version_tag(model, candidate_version, CANARY_TAG, f"pass: {result.reason}"[:5000])
        changes: dict[str, str | None] = {PRODUCTION: candidate_version, PREVIOUS: production_version,
                                          CANDIDATE: None}
        return registry.move_aliases(model, changes, "canary", f"canary passed: {result.reason}", release_run)
    if result.passed:
        result_reason = f"production moved to v{current} during the canary; it wins"
        registry.set_version_tag(model, candidate_version, CANARY_TAG, f"stopped: {result_reason}")
        return registry.move_aliases(model, {CANDIDATE: None}, "canary-stopped", result_reason, release_run)
    if result.outcome == "stopped":
        registry.set_version_tag(model, candidate_version, CANARY_TAG, result.reason[:5000])
        return registry.move_aliases(model, {CANDIDATE: None}, "canary-stopped", result.reason, release_run)
    reason = f"canary {result.outcome}: {result.reason}"
    registry.set_version_tag(model, candidate_version, REJECTED_TAG, reason[:5000])
    registry.set_version_tag(model, candidate_version, CANARY_TAG, reason[:5000])
    return registry.move_aliases(model, {CANDIDATE: None}, "canary-reject", reason, release_run)


def start_canary(registry: Registry, model: str, candidate_version: str, release_run: str | None = None
                 ) -> AliasMove | None:
    """Point `candidate` at the version under canary (a history entry of its own)."""
    return registry.move_aliases(model, {CANDIDATE: candidate_version}, "canary-start",
                                 f"v{candidate_version} under canary", release_run)
