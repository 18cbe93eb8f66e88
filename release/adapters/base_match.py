"""Intake by content: the adapter's base is the serving base only if their weights' digests are equal.

Names are not evidence (transformers 5 writes no base name into an adapter; two fine-tunes of one base
share its name): every release records the base digest of the weights it was built from on its version, and
the run's checkpoint holds the base weights the adapter trained on, so their digest is the run's side. A run
that logged it (`relctl.base_sha256`, `relctl digest DIR`) is matched from tags only, a mismatch refused in
seconds before any download; a run that did not is matched the same way once intake has hashed its
checkpoint (`prove_base`): the tag only makes the refusal faster.
"""

from __future__ import annotations

from dataclasses import dataclass

from release.adapters.target import BaseTarget
from release.core.errors import InputError
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord

LOG_HINT = ("log the digest of the base weights the adapter trained on as tag relctl.base_sha256 "
            "(`relctl digest CHECKPOINT_DIR`, or folder_base_digest(checkpoint_dir) as the README's snippet does) "
            "to be refused before the download")


@dataclass(frozen=True)
class BaseMatch:
    """The base version an adapter goes onto, and the digest both sides agree on."""

    model: str
    version: str
    base_sha256: str            # the base version's digest; the run's equals it once `proven`
    base_version: VersionRecord
    where: str = ""             # "MODEL vN (MODEL@ALIAS)", for the messages
    proven: bool = True         # False: the run logged no digest; intake's hash of its checkpoint decides


def resolve_base(registry: Registry, target: BaseTarget) -> VersionRecord:
    """The version `target` names, or InputError (exit 2)."""
    registry.require_model(target.model)
    if target.alias:
        mv = registry.version_for(target.model, target.alias)
        if mv is None:
            raise InputError(f"{target.model} has no '{target.alias}' alias",
                             hint=f"relctl status {target.model} lists its aliases; promote a base first")
        return mv
    assert target.version is not None
    return registry.get_version(target.model, target.version)


def run_base_digest(registry: Registry, run_id: str) -> str | None:
    """The base digest the training run logged as a tag; None when it logged none (intake computes it)."""
    return registry.get_run(run_id).tags.get(T.TRAINING_BASE_SHA256) or None


def match_base(registry: Registry, run_id: str, target: BaseTarget) -> BaseMatch:
    """The base version for an adapter from `run_id`, from tags only (seconds): InputError (exit 2) for a
    target that is no base, and, when the run logged its digest, naming both digests and both versions when
    it trained on other weights than the base serves. A run without the tag gives a match not yet `proven`:
    `prove_base` decides once intake has hashed the checkpoint."""
    mv = resolve_base(registry, target)
    where = f"{mv.name} v{mv.version}" + (f" ({target})" if target.alias else "")
    if mv.tags.get(T.KIND) == "adapter":
        raise InputError(f"{where} is an adapter, not a base model", hint="release adapters onto a base version")
    served = mv.tags.get(T.BASE_SHA256)
    if not served:
        raise InputError(f"{where} records no base digest ({T.BASE_SHA256}): it was released before relctl "
                         "recorded one", hint="re-release the base with this relctl, then promote --onto it")
    match = BaseMatch(model=mv.name, version=mv.version, base_sha256=served, base_version=mv, where=where,
                      proven=False)
    trained = run_base_digest(registry, run_id)
    return match if trained is None else prove_base(registry, run_id, match, trained, "its tag")


def prove_base(registry: Registry, run_id: str, match: BaseMatch, trained: str, source: str) -> BaseMatch:
    """`match`, proven by `trained` (the run's base digest, from `source`: its tag, or its checkpoint's
    weights); InputError (exit 2) naming both digests and both versions when they differ."""
    mv, where, served = match.base_version, match.where, match.base_sha256
    trained_on = _trained_on(registry, trained, mv.name)
    how = "" if source == "its tag" else f" (by {source})"
    hint_more = "" if source == "its tag" else f"; {LOG_HINT}"
    merged = mv.tags.get(T.MERGED_ADAPTER_SHA256)
    if merged and trained == served:
        raise InputError(f"{where} serves base {served} with adapter {merged} merged into it; run '{run_id}' "
                         f"trained on the base alone ({trained}{trained_on}){how}",
                         hint="release the adapter onto a version of the base released without an adapter"
                              + hint_more)
    if trained != served:
        raise InputError(f"run '{run_id}' trained on base {trained}{trained_on}{how}, but {where} was built "
                         f"from base {served}: the adapter does not belong to the weights that serve",
                         hint="release it onto the base version it trained on, or retrain it on this base"
                              + hint_more)
    return BaseMatch(model=match.model, version=match.version, base_sha256=served, base_version=mv,
                     where=where, proven=True)


def _trained_on(registry: Registry, digest: str, model: str) -> str:
    """', which is MODEL v2' when a version of `model` records that digest: the other version, by name."""
    found = [mv.version for mv in registry.find_versions(model, T.BASE_SHA256, digest)
             if mv.tags.get(T.KIND) != "adapter" and not mv.tags.get(T.MERGED_ADAPTER_SHA256)]
    return f", which is {model} v{', v'.join(sorted(found, key=int))}" if found else ", no version of " + model
