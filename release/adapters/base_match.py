"""Intake by content: the adapter's base is the serving base only if their weights' digests are equal.

Names are not evidence (transformers 5 writes no base name into an adapter; two fine-tunes of one base
share its name): the training run records the base digest of the weights it trained on
(`relctl.base_sha256`, release/core/weights_digest.py) and every release records the base digest of the
weights it was built from on its version. This is read from tags only, so a mismatch is refused in seconds,
before any download.
"""

from __future__ import annotations

from dataclasses import dataclass

from release.adapters.target import BaseTarget
from release.core.errors import InputError
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord

LOG_HINT = ("log the digest of the base weights the adapter trained on as tag relctl.base_sha256 "
            "(examples/tiny-llm/train.py: folder_base_digest(checkpoint_dir))")


@dataclass(frozen=True)
class BaseMatch:
    """The base version an adapter goes onto, and the digest both sides agree on."""

    model: str
    version: str
    base_sha256: str
    base_version: VersionRecord


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


def run_base_digest(registry: Registry, run_id: str) -> str:
    """The base digest the training run recorded, or InputError (exit 2)."""
    digest = registry.get_run(run_id).tags.get(T.TRAINING_BASE_SHA256)
    if not digest:
        raise InputError(f"run '{run_id}' records no base digest (tag {T.TRAINING_BASE_SHA256}), so the base it "
                         "trained on cannot be proven", hint=LOG_HINT)
    return digest


def match_base(registry: Registry, run_id: str, target: BaseTarget) -> BaseMatch:
    """The base version for an adapter from `run_id`, proven by digest; InputError (exit 2) naming both
    digests and both versions when the run trained on other weights than the base serves."""
    mv = resolve_base(registry, target)
    where = f"{mv.name} v{mv.version}" + (f" ({target})" if target.alias else "")
    if mv.tags.get(T.KIND) == "adapter":
        raise InputError(f"{where} is an adapter, not a base model", hint="release adapters onto a base version")
    served = mv.tags.get(T.BASE_SHA256)
    if not served:
        raise InputError(f"{where} records no base digest ({T.BASE_SHA256}): it was released before relctl "
                         "recorded one", hint="re-release the base with this relctl, then promote --onto it")
    trained = run_base_digest(registry, run_id)
    trained_on = _trained_on(registry, trained, mv.name)
    merged = mv.tags.get(T.MERGED_ADAPTER_SHA256)
    if merged and trained == served:
        raise InputError(f"{where} serves base {served} with adapter {merged} merged into it; run '{run_id}' "
                         f"trained on the base alone ({trained}{trained_on})",
                         hint="release the adapter onto a version of the base released without an adapter")
    if trained != served:
        raise InputError(f"run '{run_id}' trained on base {trained}{trained_on}, but {where} was built from "
                         f"base {served}: the adapter does not belong to the weights that serve",
                         hint="release it onto the base version it trained on, or retrain it on this base")
    return BaseMatch(model=mv.name, version=mv.version, base_sha256=served, base_version=mv)


def _trained_on(registry: Registry, digest: str, model: str) -> str:
    """', which is MODEL v2' when a version of `model` records that digest: the other version, by name."""
    found = [mv.version for mv in registry.find_versions(model, T.BASE_SHA256, digest)
             if mv.tags.get(T.KIND) != "adapter" and not mv.tags.get(T.MERGED_ADAPTER_SHA256)]
    return f", which is {model} v{', v'.join(sorted(found, key=int))}" if found else ", no version of " + model
