"""The registry's side of a finished canary: one alias move, recorded in relctl's history.

pass    production -> candidate, previous -> the old production, candidate removed (one history entry)
fail    candidate removed, the version tagged rejected with the reason; production never moves
stopped (e.g. a rollback won) candidate removed, gate.canary.status=stopped; a version still
        `registering` becomes `stopped` (it never passed: registry/states.py keeps it off production)
interrupted (SIGTERM, Ctrl-C during the canary) the same as stopped (transitions.unwind)

The reason of every outcome is in the alias history entry; the version keeps only its stable tags. Each
move is one of the release-state transitions of release/registry/transitions.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from release.gating.contract import GateResult
from release.registry import PRODUCTION, AliasMove, Registry, transitions
from release.registry import tags as T
from release.registry.transitions import ProductionMoved

if TYPE_CHECKING:  # the runner brings scipy (the judge): not for a promote that never reaches a canary
    from release.canary.runner import CanaryResult

REJECTED_TAG = T.REJECTED_REASON
STATUS_TAG = transitions.CANARY_STATUS


def canary_outcome(result: CanaryResult | GateResult) -> tuple[str, str]:
    """(outcome, reason) of a canary run or of the canary gate's result (one that could not run: "fail")."""
    if not isinstance(result, GateResult):  # the runner's CanaryResult
        return result.outcome, result.reason
    outcome = result.details.get("outcome")
    if not isinstance(outcome, str):
        outcome = "pass" if result.status == "pass" else "fail"
    return outcome, str(result.details.get("reason") or result.reason)


def finish_canary(registry: Registry, model: str, candidate_version: str, production_version: str,
                  result: CanaryResult | GateResult, release_run: str | None = None) -> AliasMove | None:
    """Move the aliases for the canary's outcome; returns the recorded move (None if nothing changed).

    `result` is the runner's CanaryResult or the canary gate's GateResult. A pass only promotes while
    production still is `production_version`: if it moved during the canary (a rollback), the rollback
    wins and the candidate is only un-aliased.
    """
    outcome, reason = canary_outcome(result)
    if outcome == "pass":
        # The same compare-and-set under the model's lease as promote's register: production must still
        # be the version the canary compared with when the aliases move, not only when it was read.
        try:
            move, _ = transitions.promote(registry, model, candidate_version, f"canary passed: {reason}",
                                          release_run, expected_production=production_version,
                                          clear_candidate=True, action="canary")
            registry.set_version_tag(model, candidate_version, STATUS_TAG, "pass")
            return move
        except ProductionMoved:
            pass
        current = registry.aliases(model).get(PRODUCTION)
        return transitions.unwind(registry, model, candidate_version,
                                  f"production moved to v{current} during the canary; it wins", release_run)
    if outcome == "stopped":
        return transitions.unwind(registry, model, candidate_version, reason, release_run)
    return transitions.reject(registry, model, candidate_version, f"canary {outcome}: {reason}", release_run,
                              action="canary-reject", tags={STATUS_TAG: "fail"})


def start_canary(registry: Registry, model: str, candidate_version: str, release_run: str | None = None
                 ) -> AliasMove | None:
    """Point `candidate` at the version under canary (a history entry of its own)."""
    return transitions.nominate(registry, model, candidate_version, "canary-start",
                                f"v{candidate_version} under canary", release_run)
