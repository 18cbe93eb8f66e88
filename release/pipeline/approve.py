"""`relctl approve MODEL/VERSION --reason ...`: record an approval and move production to the version.

With `require_approval` in release.yaml, a version that passed its gates stops as `awaiting-approval`
(aliased `candidate`; production unmoved). Approving it:

1. refuses, exit 2 and one line, a version that does not exist or is not waiting for an approval (it was
   never gated, failed its gates, was cut short, or is released already: registry/states.py) and one whose
   production changed since its gates compared with it (the comparison no longer holds);
2. verifies its package (manifest digest and signature by a trusted key), as every production move does;
   an adapter's must be bound (signed manifest) to its base's production version, as a rollback's must;
3. under the model's lease: reads the version again, writes the approval (who, when, why, the package's
   digests) signed by the release key when one is configured, marks it `approved` and moves production
   (previous <- what production was, candidate cleared if it was this version) in one history entry whose
   user is the approver; then tags it `released` and puts one line naming the approver on its card.

An approve that dies after the approval was written and before production moved leaves it `approved`,
which a second `relctl approve` finishes (and `rollback --to` may move production to).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from release.core.errors import InputError
from release.core.escape import markdown
from release.registry import PRODUCTION, AliasMove, Registry, transitions
from release.registry import tags as T
from release.registry.states import APPROVED, AWAITING_APPROVAL, approval_refusal
from release.registry.versions import fetch_package
from release.signing.approval import Approval, Approver, approval_status, new_approval, sign_approval
from release.signing.keys import SigningKey, Trust
from release.signing.package import Verdict

APPROVED_MARK = "**Approved**"


@dataclass(frozen=True)
class Approved:
    approval: Approval
    move: AliasMove | None
    signed_by: str | None  # the release key's label, or None: unsigned (no key configured)


def approve(registry: Registry, model: str, version: str, reason: str, who: Approver, trust: Trust,
            signer: SigningKey | None, warn: Callable[[str], None]) -> Approved:
    if signer is None and not trust.off:
        raise InputError("approvals are signed, and no release key is configured",
                         hint="run `relctl keygen`, or set RELCTL_SIGNING_KEY to the release key")
    if signer is not None and not trust.off and not trust.trusts(signer.fingerprint):
        # An approval this project cannot verify would move production to a version nothing then serves.
        raise InputError(f"signing key {signer.label} (fingerprint {signer.fingerprint[:16]}) is not a trusted key "
                         "of this project, so its approval would not count; nothing was approved",
                         hint=f"approve with the release key (trusted: {trust.named()})")
    registry.require_model(model)
    mv = registry.get_version(model, version)  # InputError (exit 2) for a version that does not exist
    _check_approvable(registry, model, version, dict(mv.tags))
    approval = new_approval(model, version, (mv.tags.get(T.MANIFEST_SHA256, ""), mv.tags.get(T.CONTENT_SHA256, "")),
                            mv.tags.get(T.RELEASE_RUN), who, reason)
    with tempfile.TemporaryDirectory() as tmp:
        # Refuses the attack (a rewritten package with matching registry digests) before any approval exists.
        package = fetch_package(registry, model, version, Path(tmp), mv, trust=trust, warn=warn)
    # An adapter: production moves only onto a version built for its base's production (its signed package
    # says which), as a rollback's does; else no running base would serve what was approved.
    from release.adapters.rollback import refuse_other_base  # noqa: PLC0415 - adapters only

    refuse_other_base(registry, model, version, package)
    statement = approval.statement()
    signature = sign_approval(statement, signer) if signer is not None else ""

    def check(tags: dict[str, str], current: dict[str, str]) -> None:
        # Under the lease: another approve, a rollback or a rejection may have got here first.
        _check_approvable(registry, model, version, tags, current)
        if tags.get(T.CONTENT_SHA256) != approval.content_sha256:
            raise InputError(f"{model} v{version}: its package digests changed while it was being approved",
                             hint="check the version with relctl verify, then approve again")

    move, notes = transitions.approve(registry, model, version, check,
                                      {T.APPROVAL: statement, T.APPROVAL_SIGNATURE: signature},
                                      f"approved by {who.name}: {approval.reason}", approval.release_run,
                                      user=who.name)
    for note in notes:
        warn(note)
    signed_by = signer.label if signer is not None else None
    _mark_card(registry, model, version, approval, signer)
    return Approved(approval, move, signed_by)


def _check_approvable(registry: Registry, model: str, version: str, tags: dict[str, str],
                      aliases: dict[str, str] | None = None) -> None:
    refusal = approval_refusal(tags)
    if refusal is not None:
        raise InputError(f"{model} v{version} cannot be approved: {refusal}",
                         hint="only a version that passed its gates under require_approval waits for an approval "
                              f"(`relctl status {model}`, `relctl history {model}`)")
    if T.GATED_AGAINST not in tags:
        return
    expected = tags[T.GATED_AGAINST] or None
    now = (registry.aliases(model) if aliases is None else aliases).get(PRODUCTION)
    if now != expected and now != version:
        was = f"v{expected}" if expected else "no production version"
        raise InputError(f"{model} v{version} cannot be approved: its gates compared it with {was}, but production "
                         f"is now {f'v{now}' if now else 'none'}",
                         hint="re-run relctl promote of its training run to gate it against today's production")


def _mark_card(registry: Registry, model: str, version: str, approval: Approval, signer: SigningKey | None) -> None:
    """One line on the version's card naming the approver (the history entry and the signed tag are the record)."""
    card = registry.get_version(model, version).description or ""
    signed = f"; signed by release key {signer.fingerprint[:16]}" if signer is not None else "; unsigned"
    line = (f"{APPROVED_MARK} by {markdown(approval.approver)} ({approval.approver_source}) on {approval.at}: "
            f"{markdown(approval.reason)}{signed}.")
    registry.set_description(model, version, f"{line}\n\n{card}" if card else line)


def require_approved(registry: Registry, model: str, version: str, verdict: Verdict, trust: Trust) -> None:
    """Before production moves to `version` other than by approve itself (rollback --to): a version that needed
    an approval (its signed provenance says so, or its state does) moves only with a valid signed approval.
    Hand-written approval tags without a signature by a trusted key are not an approval."""
    tags = dict(registry.get_version(model, version).tags)
    state = tags.get(T.RELEASE_STATE)
    if not (verdict.provenance.get("require_approval") or state in (AWAITING_APPROVAL, APPROVED)):
        return
    found = approval_status(tags, trust, model, version)
    if not found.approved:
        raise InputError(f"production may not point at {model} v{version}: it is {state or 'untracked'} under "
                         f"require_approval, and {found.text}",
                         hint=f"relctl approve {model}/{version} --reason ... (signed with the release key)")
