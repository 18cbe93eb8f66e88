"""One function per command. The CLI parses and prints; everything it does happens here.

Only what the read commands (status, history, trace) need is imported here; the pipeline, the gates and the
config are imported by the functions that use them, so a read starts with mlflow and nothing else heavy
(benchmarks/cli_latency.py).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from release.commands.preflight import Preflight, preflight
from release.core.errors import InputError, RegistryError
from release.core.escape import markdown
from release.core.model_name import check_model_name, check_version_number
from release.core.package import LEGACY_BACKEND
from release.registry import PREVIOUS, PRODUCTION, AliasMove, Registry, links, transitions
from release.registry import tags as T
from release.registry.aliases import history_from_tags
from release.registry.client import open_registry
from release.registry.refs import APPROVE, parse_version, serve_ref
from release.registry.store import connect, resolve_store
from release.signing.keys import project_signing_key, project_trust

if TYPE_CHECKING:
    from release.adapters.rollback import SwitchServer
    from release.core.progress import Progress
    from release.pipeline.report import ReleaseReport


def promote(
    run_id: str,
    project_dir: Path,
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    summary_path: Path | None = None,
    keep_going: bool = False,
    loaded: Preflight | None = None,
) -> ReleaseReport:
    """Promote training run `run_id`; raises Blocked (exit 1) when validation or a gate refuses it.

    After a failed gate the later gates do not run unless `keep_going`.

    With `summary_path`, a markdown summary is appended there whatever the outcome (CI job summaries).
    `loaded`: release.yaml and the gates as the CLI already checked them (release/commands/preflight.py).
    """
    from release.config import config_label, errors_name  # noqa: PLC0415 - not for the reads
    from release.core.progress import Progress  # noqa: PLC0415 - as above
    from release.pipeline.contract import require_contract  # noqa: PLC0415 - as above

    pre = loaded or preflight(project_dir, config_path, overrides)
    progress = progress or Progress(quiet=True)
    with errors_name(config_label(pre.cfg)):   # a problem about a -c file names it, not release.yaml
        store = resolve_store(project_dir)
        connect(store)
        # The run contract first, as `relctl check` runs it: a refused run never pays for importing the pipeline
        # (stages, signing, canary: ~0.3 s; benchmarks/cli_latency.py).
        contract = require_contract(Registry(store), run_id, pre.cfg, pre.gates, pre.config_dir or project_dir,
                                    progress.note)
        from release.pipeline.promote import Promotion  # noqa: PLC0415 - the whole pipeline: only for a run that passed

        promotion = Promotion(pre.cfg, store, project_dir, pre.config_path, progress, keep_going)
        return promotion.run(run_id, dry_run=dry_run, summary_path=summary_path, contract=contract,
                             gates=pre.gates)


def check(run_id: str, project_dir: Path, config_path: Path | None = None, onto: str | None = None,
          model: str | None = None, loaded: Preflight | None = None) -> Any:
    """The run contract for `run_id` under this project's release.yaml (release.pipeline.contract); with
    `onto` (promote --onto's base) or release.mode adapter, the adapter release's pre-flight, `model` naming
    the registered model as promote's --model does (with --onto: the adapter's)."""
    from release.adapters.api import adapter_overrides  # noqa: PLC0415 - adapters: not for the other reads
    from release.config import config_label, errors_name, named  # noqa: PLC0415 - as above
    from release.pipeline.contract import check_run  # noqa: PLC0415 - as above

    pre = loaded or preflight(project_dir, config_path)
    overrides = adapter_overrides(pre.cfg, onto, model)  # promote --onto's release, as release.yaml would say it
    if overrides:
        pre = preflight(project_dir, pre.config_path, overrides)
    file = config_label(pre.cfg)
    with errors_name(file):   # a problem about a -c file names it, not release.yaml
        registry = open_registry(project_dir, read_only=True)
        report = check_run(registry, run_id, pre.cfg, pre.gates, pre.config_dir or project_dir)
    report.problems = [dataclasses.replace(p, message=named(p.message, file)) for p in report.problems]
    return report


def rollback(model: str, project_dir: Path, reason: str, to_version: str | None = None,
             progress: Progress | None = None, allow_unreleased: bool = False,
             strand_adapters: bool = False, seconds: dict[str, float] | None = None,
             server: SwitchServer | None = None) -> AliasMove:
    """Point `production` back at the version it replaced (or `to_version`), after verifying its package.

    The target is chosen under the model's lock from the aliases as they are then, so two rollbacks at
    once cannot both act on the same state: the second sees the first's result (transitions.rollback). A
    target whose state the alias rule refuses (registry/states.py: rejected, stopped, registering) needs
    `allow_unreleased`. An adapter's target must be built for its base's production version (its signed
    package decides). `server` (an adapter's --server, its admin key checked already): probed before the
    alias moves, switched after (release/adapters/rollback.py has the order). `seconds`, when given, receives
    where the time went: registry_open (MLflow's store, its imports included), verify (download and signature
    check of the target's package), probe (the server), alias_move (the move under the lock, the card's
    rollback line), switch_call (the switch on the server, the round trip).
    """

    spent = seconds if seconds is not None else {}
    mark = time.monotonic()

    def lap(key: str) -> None:
        nonlocal mark
        now = time.monotonic()
        spent[key] = round(spent.get(key, 0.0) + now - mark, 3)
        mark = now

    check_model_name(model, "model")  # before the store is opened: a bad name touches nothing
    if to_version is not None:
        check_version_number(to_version, "--to")
    from release.adapters.rollback import (  # noqa: PLC0415 - adapters: not for the read commands
        probe_server,
        refuse_other_base,
        refuse_stranding,
        switch_after_move,
    )
    from release.core.progress import Progress  # noqa: PLC0415 - package checks: not for the read commands
    from release.pipeline.approve import require_approved  # noqa: PLC0415 - as above
    from release.registry.versions import fetch_verified  # noqa: PLC0415 - as above

    registry = open_registry(project_dir)
    registry.require_model(model)
    lap("registry_open")
    for note in registry.reap_dead_runs(model):
        (progress or Progress(quiet=True)).note(note)
    verified: set[str] = set()
    trust = project_trust(project_dir)

    def verify(target: str) -> None:
        lap("alias_move")
        with tempfile.TemporaryDirectory() as tmp:
            # refuses a package that differs from its release, is not signed by a trusted key, or vouches for
            # another version; then a version released under require_approval needs its signed approval
            package, verdict = fetch_verified(registry, model, target, Path(tmp), trust=trust,
                                              warn=(progress or Progress(quiet=False)).note)
        require_approved(registry, model, target, verdict, trust)
        bound = refuse_other_base(registry, model, target, package)  # an adapter: onto its base's production
        lap("verify")
        if server is not None:
            if bound is None:
                raise InputError(f"--server {server.url}: {model} is a whole model, not an adapter; nothing moved",
                                 hint=f"roll it back without --server (relctl rollback {model}), then redeploy it")
            probe_server(server, f"{model} v{target}", package)  # before the alias moves: the switch can follow
            lap("probe")
        verified.add(target)

    def check(target: str, aliases: dict[str, str]) -> None:
        """Under the lock: the target as the aliases are now (verified again only if it changed)."""
        if not strand_adapters:
            refuse_stranding(registry, model, aliases.get(PRODUCTION), target)
        if target not in verified:
            verify(target)

    # Verified before the lock is taken (a download can be slow); again under it only if the target changed.
    seen = registry.aliases(model)
    guess = to_version or seen.get(PREVIOUS)
    if guess is not None and guess != seen.get(PRODUCTION):
        if not strand_adapters:  # before the download: refused in seconds (and again under the lock)
            refuse_stranding(registry, model, seen.get(PRODUCTION), guess)
        verify(guess)

    move, notes = transitions.rollback(registry, model, to_version, check, reason, override=allow_unreleased)
    for note in notes:
        (progress or Progress(quiet=True)).note(note)
    if move is None:
        raise InputError(f"{model}: the rollback would change nothing", hint="check `relctl status` for the aliases")
    mark_rolled_back(registry, model, move)
    lap("alias_move")
    if server is not None:
        switch_after_move(server, model, move, project_dir)
        lap("switch_call")
    return move


ROLLED_BACK_MARK = "**Rolled back**"


def mark_rolled_back(registry: Registry, model: str, move: AliasMove) -> None:
    """Put the rollback on the card of the version it took production from: a reviewer reading that version
    in the registry UI must not see only "Outcome: released". The alias history stays the record; this is
    its echo on the page people open."""
    left, target = move.changes.get(PRODUCTION, [None, None])
    if left is None or target is None:
        return
    card = registry.get_version(model, left).description or ""
    line = (f"{ROLLED_BACK_MARK} on {move.at} to v{target} by {markdown(move.user)}: {markdown(move.reason)}. "
            "This version no longer serves production (`relctl history " + model + "`).")
    # The newest rollback first; the card below keeps the release's own evidence unchanged.
    registry.set_description(model, left, f"{line}\n\n{card}" if card else line)


def register(package_dir: Path, model: str, project_dir: Path, production: bool = False) -> tuple[str, str]:
    """Register a package as a new version of `model` (checksums verified first); optionally production."""
    check_model_name(model, "--model")
    from release.core.package import verify_package  # noqa: PLC0415 - not for the read commands
    from release.stages.register import register_package  # noqa: PLC0415 - a stage: as above

    package = verify_package(package_dir)
    signer = project_signing_key(project_dir)  # before anything is written: a bad key fails first
    return register_package(open_registry(project_dir), package, model, production, signer)


def verify(spec: str, project_dir: Path) -> dict[str, Any]:
    """`relctl verify`: a registered version (MODEL/VERSION, MODEL@ALIAS) or a package folder, checked against
    its manifest and signed by a trusted key. Unsigned is refused here whatever signing.unsigned says."""
    from release.core.package import verify_package  # noqa: PLC0415 - keeps api's import light
    from release.registry.versions import fetch_verified  # noqa: PLC0415 - as above
    from release.signing.package import verify_signature  # noqa: PLC0415 - as above

    trust = project_trust(project_dir)
    if not trust.off:
        trust = dataclasses.replace(trust, unsigned="refuse")
    if Path(spec).is_dir():
        package = verify_package(Path(spec))
        verdict = verify_signature(package.root, trust, Path(spec).name)
        return {"package": spec, "signature": verdict.status, "signed_by": verdict.signed_by,
                "fingerprint": verdict.fingerprint, "provenance": verdict.provenance,
                **_adapter_binding(package, Path(spec).name, None)}
    ref = serve_ref(spec)
    registry = open_registry(project_dir)
    version = ref.version
    if version is None:
        found = registry.version_for(ref.model, str(ref.alias))
        if found is None:
            raise InputError(f"{spec}: no such model or alias in the registry", hint=f"relctl status {ref.model}")
        version = str(found.version)
    mv = registry.get_version(ref.model, version)
    with tempfile.TemporaryDirectory() as tmp:
        package, verdict = fetch_verified(registry, ref.model, version, Path(tmp), mv, trust=trust)
        bound = _adapter_binding(package, f"{ref.model} v{version}", mv)
    return {"model": ref.model, "version": version, "signature": verdict.status, "signed_by": verdict.signed_by,
            "fingerprint": verdict.fingerprint, "provenance": verdict.provenance,
            "approval": _verified_approval(mv.tags, trust, ref.model, version), **bound}


def _adapter_binding(package: Any, label: str, mv: Any) -> dict[str, Any]:
    """{"adapter_of": the base an adapter's signed manifest binds it to} ({} for a whole model); exit 2 when
    the version's registry tags name another base (they were changed after release: every reader follows the
    manifest and refuses the adapter on the base the tags name)."""
    from release.adapters.trust import KIND, binding_of, tags_disagree  # noqa: PLC0415 - as above

    if package.data.get("kind") != KIND:
        return {}
    bound = binding_of(package, label)
    wrong = tags_disagree(mv, bound) if mv is not None else None
    if wrong:
        raise InputError(f"{label}: its signed package binds it to {bound.describe()}, but its registry tags say "
                         f"otherwise: {wrong}; the tags were changed after release",
                         hint=f"serve, render, canary and rollback follow the signed package and refuse it on any "
                              f"other base; restore the tags to {bound.model} v{bound.version}")
    return {"adapter_of": bound.to_dict()}


def _verified_approval(tags: dict[str, str], trust: Any, model: str, version: str) -> dict[str, Any] | None:
    """The version's approval (relctl approve) as approval_status reads it; None when it was never approved.
    An approval that is not signed by a trusted key, or is for other bytes, is exit 2: the version is not
    approved, and someone wrote that it was."""
    from release.signing.approval import approval_status  # noqa: PLC0415 - keeps api's import light

    found = approval_status(tags, trust, model, version)
    if found.text == "not approved":
        return None
    if not found.approved:
        raise InputError(f"{model} v{version}: {found.text}",
                         hint=f"only `relctl approve {model}/{version}` with a trusted release key approves a version")
    return {"approver": found.approver, "at": found.at, "reason": found.reason, "signed_by": found.signed_by,
            "text": found.text}


def approve(spec: str, project_dir: Path, reason: str, progress: Progress | None = None) -> Any:
    """`relctl approve MODEL/VERSION`: record who approved a version waiting for it, move production to it
    (release/pipeline/approve.py). Refusals are exit 2, before anything is written."""
    from release.core.progress import Progress  # noqa: PLC0415 - as above
    from release.pipeline.approve import approve as approve_version  # noqa: PLC0415 - not for the read commands
    from release.signing.approval import approver  # noqa: PLC0415 - as above

    name, version = parse_version(spec, APPROVE)
    who = approver(project_dir)
    signer = project_signing_key(project_dir)  # a bad key fails here, before anything is written
    trust = project_trust(project_dir)
    registry = open_registry(project_dir)
    return approve_version(registry, name, version, reason, who, trust, signer,
                           (progress or Progress(quiet=False)).note)


def signing_off(project_dir: Path) -> bool:
    """release.yaml says `signing: off`: history and status say "unsigned" in words."""
    from release.config import load_config  # noqa: PLC0415 - keeps api's import light
    from release.signing.keys import project_config  # noqa: PLC0415

    return not load_config(project_config(project_dir)).signing.enabled


def _signature_words(tags: dict[str, str]) -> str:
    """What status says about a version's signature (the tag register wrote; `relctl verify` checks it)."""
    signed_by = tags.get(T.SIGNED_BY)
    if signed_by == "unsigned":
        return "unsigned (released with signing: off)"
    return f"signed by key {signed_by[:16]}" if signed_by else "unsigned (released before signing)"


def _approval_words(tags: dict[str, str], project_dir: Path, model: str, version: str) -> str | None:
    """The approval as approval_status reads it (a hand-written unsigned one is "not approved"); None: none."""
    from release.signing.approval import approval_status  # noqa: PLC0415 - keeps api's import light

    if not tags.get(T.APPROVAL):
        return None
    try:
        trust = project_trust(project_dir)
    except InputError as exc:
        return f"not checked: {exc.message}"
    return approval_status(tags, trust, model, version).text


def sign_versions(model: str, project_dir: Path, version: str | None = None) -> list[Any]:
    """`relctl sign MODEL`: sign the versions released unsigned (release/pipeline/sign_existing.py)."""
    check_model_name(model, "model")
    from release.pipeline.sign_existing import sign_existing  # noqa: PLC0415 - not for the read commands

    key = project_signing_key(project_dir)  # refuses a missing or untrusted key before anything is read
    trust = project_trust(project_dir)
    if key is None:
        raise InputError("release.yaml says `signing: off`", hint="remove `signing: off` first, then relctl sign")
    return sign_existing(open_registry(project_dir), model, key, trust, version)


def history(model: str, project_dir: Path) -> list[AliasMove]:
    """The alias history: one read of the registered model (its tags hold it), unless a move is pending."""
    check_model_name(model, "model")
    registry = open_registry(project_dir, read_only=True)
    record = registry.read_model(model)
    if registry.sweep_if_pending(record):
        return registry.history(model)
    return history_from_tags(dict(record.tags))


def engine_labels(model: str, project_dir: Path) -> dict[str, str]:
    """{version: "engine precision"} of every version of `model`: what rollback and history print beside each
    version, so a move between engines is never silent."""
    check_model_name(model, "model")
    return open_registry(project_dir, read_only=True).engine_labels(model)


def status(model: str | None, project_dir: Path) -> dict[str, Any]:
    """Aliases → versions with lineage and gate summary; base <-> adapters and the running servers
    (release/commands/serving_view.py); with no model, the registered models."""
    from release.adapters.trust import KIND  # noqa: PLC0415 - only a status of one model
    from release.commands import serving_view  # noqa: PLC0415 - as above

    if model is not None:
        check_model_name(model, "model")
    registry = open_registry(project_dir, read_only=True)
    if model is None:
        return {"models": registry.list_models()}
    # One read for the aliases; per alias its version, its release run and (MLflow 3) its LoggedModel.
    record = registry.read_model(model)
    if registry.sweep_if_pending(record):
        record = registry.read_model(model)
    out: dict[str, Any] = {"schema_version": 2, "model": model, "aliases": {}}
    aliased = {}
    for alias, version in sorted((a, str(v)) for a, v in record.aliases.items()):
        try:
            mv = registry.get_version(model, version)
        except Exception as exc:  # an alias to a deleted version is worth showing, not crashing on
            raise RegistryError(f"{model}@{alias} points at v{version}, which cannot be read: {exc}") from exc
        aliased[alias] = mv
        tags = dict(mv.tags)
        run = registry.get_run(tags[T.RELEASE_RUN]) if T.RELEASE_RUN in tags else None
        metrics, _ = registry.recorded_numbers(mv, run)
        lineage = {**run.tags, **tags} if run is not None else tags
        out["aliases"][alias] = {
            "version": version,
            "created": mv.creation_timestamp,
            "training_run": tags.get(T.TRAINING_RUN),
            "git_commit": tags.get(T.GIT_COMMIT),
            "precision": tags.get(T.PRECISION),
            # Versions released before backends were named were all LEGACY_BACKEND packages.
            "backend": tags.get(T.BACKEND, LEGACY_BACKEND),
            "serving_config_hash": tags.get(T.SERVING_CONFIG_HASH),
            "data": {k: v for k, v in lineage.items() if k.startswith(T.DATA_PREFIX)},
            "gates": T.gate_statuses(tags),
            "validation": T.with_prefix(metrics, T.VALIDATION_PREFIX),
            "signature": _signature_words(tags),
            "approval": _approval_words(tags, project_dir, model, version),
            "model_uri": links.model_uri(model, version),
            "link": links.version_link(registry.store.tracking_uri, model, version),
        }
    if any(mv.tags.get(T.KIND) == KIND for mv in aliased.values()):
        view = serving_view.adapter_view(registry, aliased)
        out["adapter_of"] = view["base"]
    else:
        view = serving_view.base_view(registry, record)
        out["adapters"] = view["adapters"]
        for info in out["aliases"].values():
            info["adapters"] = {a["model"]: a["version"] for a in view["adapters"]
                                if a["base_version"] == info["version"]}
    out["servers"] = view["servers"]
    return out
