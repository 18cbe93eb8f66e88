"""`relctl promote`: the phases of a release, each stage one typed object run by the Pipeline.

before register   intake -> merge -> reference -> convert -> validate -> memory -> package -> gates
register          the version (found again after a crash, never twinned) and its alias move, under the
                  model's lock, refused if production moved while the gates ran
after register    gates that need the registered version (the canary), with `candidate` set meanwhile

Aliases move only in the register phase or after, once every check passed, so a failed or blocked
promote changes no production alias. Each attempt is a release run holding its report, whatever the outcome.

This module keeps the order of the phases. The build stages are wired in release/pipeline/builds.py (for a
configuration passed in), the engines comparison is release/pipeline/comparison.py, every release-state
transition (register, promote, reject, await approval, unwind) is release/registry/transitions.py, and the
report's links are release/pipeline/report_links.py.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from release.backends import AUTO, Backend
from release.backends.base import LoadedModel
from release.config import ReleaseConfig, config_label
from release.core.errors import Blocked, InputError, ReleaseError
from release.core.faults import pause_point
from release.core.package import PackageManifest
from release.core.progress import Progress
from release.core.units import size
from release.gating.contract import Gate, GateContext, GatePhase, GateResult, ProductionRef, blocks
from release.gating.plugins import load_gates
from release.gating.reference import cache_dir_of, usage
from release.gating.report import render_markdown, result_to_dict
from release.gating.run import (
    evidence_digests,
    gates_of_phase,
    log_result,
    plot_artifacts,
    production_ref,
    run_phase_gates,
)
from release.pipeline.advice import after_validation_failure
from release.pipeline.builds import Builds, reference_loader
from release.pipeline.comparison import compare_in_release
from release.pipeline.contract import ContractReport, require_contract
from release.pipeline.engines import Comparison, engines_section, load_gate
from release.pipeline.failure import Terminated, classify
from release.pipeline.precision_search import searches
from release.pipeline.report import (
    DETAILS_ARTIFACT,
    REPORT_ARTIFACT,
    REPORT_LINK,
    ReleaseReport,
    details_markdown,
    model_card,
    release_details,
    release_metrics,
    summary_markdown,
)
from release.pipeline.report_html import release_page
from release.pipeline.report_links import add_links
from release.pipeline.runner import Done, Pipeline, promote_lock, work_dir_for
from release.pipeline.workdirs import prune_released
from release.registry import PRODUCTION, Registry, transitions
from release.registry import tags as T
from release.registry.errors import as_registry_error
from release.registry.runs import ReleaseRun
from release.registry.states import AWAITING_APPROVAL
from release.registry.store import Store
from release.registry.transitions import ProductionMoved
from release.signing.keys import SigningKey, Trust, release_key, trusted_keys
from release.stages import register as reg
from release.stages.intake import IntakeInputs, IntakeResult, IntakeStage
from release.stages.lineage import repo_state
from release.stages.merge import MergeInputs, MergeStage


class Promotion:
    def __init__(self, cfg: ReleaseConfig, store: Store, project_dir: Path, config_path: Path | None,
                 progress: Progress, keep_going: bool = False) -> None:
        self.cfg = cfg
        self.keep_going = keep_going  # run every gate even after one failed (promote --keep-going)
        self.registry = Registry(store)
        self.project_dir = project_dir
        self.config_path = config_path
        self.progress = progress
        self.gate_results: list[GateResult] = []
        self.engines: Comparison | None = None  # the engines comparison, when release.yaml lists engines
        self.gates_markdown: str | None = None
        self.pipeline: Pipeline | None = None
        self.recorded: dict[str, float] = {}   # numbers logged to the version's LoggedModel by this release
        self.signer: SigningKey | None = None
        self.trust = Trust()
        self.engine_why: str | None = None  # why the contract's backend (release.yaml, or auto's pick)
        # Opens the fp32 reference this release built, for gates that compare with it (GateContext).
        self.load_reference: Callable[[], LoadedModel] | None = None

    def card(self, report: ReleaseReport) -> str:
        """The model card: the verdict and the figures that decide it; every other figure behind a link
        (report/details.md of the release run, written by _log_report)."""
        add_links(self.registry, report)
        self._count_reference(report)
        return model_card(report, self._card_sections(report))

    def _count_reference(self, report: ReleaseReport) -> None:
        """How often this release scored its fp32 reference (and reused it): the reference cache's log."""
        if self.pipeline is not None:
            report.reference_scoring = usage(cache_dir_of(self.pipeline.work_dir))

    @staticmethod
    def _card_sections(report: ReleaseReport) -> list[str]:
        """Sections of their own (tables) between the decision and the details link."""
        return ["\n".join(engines_section(report.engines))] if report.engines else []

    def run(self, run_id: str, dry_run: bool, summary_path: Path | None = None,
            contract: ContractReport | None = None, gates: list[Gate] | None = None) -> ReleaseReport:
        """`contract` and `gates`: the run contract as the caller already checked it (api.promote checks it
        before importing this module); else checked here."""
        # every gate validates its block first
        gates = gates if gates is not None else load_gates(self.cfg.gates, config_label(self.cfg))
        if contract is None:
            # The same checks as `relctl check`, so check never passes what promote refuses; all at once, in
            # seconds, before any slow stage.
            contract = require_contract(self.registry, run_id, self.cfg, gates, self._repo_anchor(),
                                        self.progress.note)
        backend = contract.backend
        name = contract.model
        self.engine_why = contract.engine_why
        # Loaded now (check_run already refused a bad key): the key signs at register, the trust verifies
        # the production version the gates compare with.
        self.signer = release_key(self.cfg.signing, self._repo_anchor())
        self.trust = trusted_keys(self.cfg.signing, self._repo_anchor())
        if self.signer is None:
            self.progress.note("signing is off in release.yaml (signing: off): the release will be unsigned")
        if backend is None or name is None:  # check_run names every problem that leaves either unknown
            raise ReleaseError(f"run '{run_id}': the run contract found no problem, yet chose no backend or name")
        with promote_lock(f"{self.registry.store.tracking_uri}|{run_id}", f"run {run_id}",
                          work_dir_for(self.project_dir, run_id), self.progress):
            return self._run_locked(run_id, name, gates, backend, dry_run, summary_path)

    def _run_locked(self, run_id: str, name: str, gates: list[Gate], backend: Backend, dry_run: bool,
                    summary_path: Path | None) -> ReleaseReport:
        for note in [*self.registry.reap_dead_runs(name), *self.registry.repair(name)]:
            self.progress.note(note)
        report = ReleaseReport(model=name, training_run=run_id, release_run=None,
                               precision=self.cfg.convert.precision)
        report.engine = {"backend": backend.id, "precision": self.cfg.convert.precision, "why": self.engine_why}
        if not (self.cfg.engines and self.cfg.convert.backend == AUTO):  # else the comparison's verdict names it
            self.progress.info(f"engine: {backend.id} {self.cfg.convert.precision}"
                               + (f" ({self.engine_why})" if self.engine_why else ""))
        tags = {T.TRAINING_RUN: run_id, T.NOTE: f"relctl promote of training run {run_id}"}
        with self.registry.release_run(name, f"promote {name} from {run_id[:8]}", tags) as run:
            report.release_run = run.run_id
            run.log_params({"precision": self.cfg.convert.precision, "backend": backend.id, "dry_run": dry_run})
            try:
                self._phases(run, run_id, name, report, gates, backend, dry_run)
            except BaseException as exc:
                if isinstance(exc, ReleaseError):
                    exc.report = report
                if not isinstance(exc, Blocked):
                    failure = classify(exc, resumable=True)
                    report.outcome, report.exit_code = "error", failure.exit_code
                    report.failures.append(failure.message)
                self._finish(run, report, summary_path, failing=exc)
                raise
            self._finish(run, report, summary_path, failing=None)
        return report

    def _finish(self, run: ReleaseRun, report: ReleaseReport, summary_path: Path | None,
                failing: BaseException | None) -> None:
        """Record the report (links, release-run artifacts, the CI summary) whatever the outcome.

        When an error is already on its way out, a failure here (often the same dead tracking server) is
        a note, never raised: raised from a `finally`, an MlflowException replaced a RegistryError (exit 4)
        and the promote exited 3, as a bug. Once one registry write failed, the others are not tried."""
        steps: list[Callable[[], None]] = [lambda: add_links(self.registry, report),
                                           lambda: self._log_report(run, report)]
        for step in steps:
            try:
                step()
            except Exception as exc:
                if failing is None:
                    self._write_summary(report, summary_path)
                    wrapped = as_registry_error(exc, "cannot record the release report")
                    if wrapped is not None:
                        raise wrapped from exc
                    raise
                self.progress.note(f"the release report could not be recorded: {classify(exc).message}")
                break
        self._write_summary(report, summary_path)

    def _write_summary(self, report: ReleaseReport, summary_path: Path | None) -> None:
        if summary_path is not None:
            with summary_path.open("a") as fh:
                fh.write(summary_markdown(report, self.gates_markdown))

    # ------------------------------------------------------------------------------------------
    def _phases(self, run: ReleaseRun, run_id: str, name: str, report: ReleaseReport, gates: list[Gate],
                backend: Backend, dry_run: bool) -> None:
        pipe = self.pipeline = Pipeline(work_dir_for(self.project_dir, run_id), self.progress)
        intake = pipe.run(IntakeStage(IntakeInputs(run_id=run_id, artifact_path=self.cfg.source.artifact_path),
                                      self.registry))
        report.lineage = {**intake.result.lineage, "release_repo": repo_state(self._repo_anchor())}
        self._check_precision_range(intake.result)
        checkpoint, upstream = self._merge(pipe, intake)
        builds = Builds(pipe, intake, checkpoint, upstream, self._repo_anchor())
        cfg = self.cfg  # what is built: release.yaml's convert, or the engine auto chose from the comparison
        if cfg.engines or searches(cfg):  # engines side by side (precision: auto: each variant it builds)
            compared = compare_in_release(cfg, builds, name, report, gates, backend, self.progress)
            self.engines, cfg, backend = compared.comparison, compared.cfg, compared.backend
        reference, candidate = builds.convert(cfg, backend)
        self.load_reference = reference_loader(reference, candidate, checkpoint)
        validation = builds.validate(cfg, reference, candidate)
        report.validation = validation.result.model_dump(mode="json")
        if not validation.result.passed:
            report.block(validation.result.failures)
            raise Blocked(f"validation failed: {validation.result.failures[0]}",
                          hint=after_validation_failure(cfg.convert.precision))
        memory = builds.memory(cfg, candidate)
        report.memory = memory.result.estimate
        if not memory.result.fits:
            e = memory.result.estimate
            reason = (f"memory plan does not fit: peak {size(e['peak_bytes'])} > "
                      f"{size(e['capacity_bytes'])} at {e['concurrency']} x {e['context_tokens']} tokens "
                      f"(x{e['rollout_replicas']} replicas during a rollout); at most {e['max_concurrency']} "
                      "concurrent sequences fit")
            report.block([reason])
            raise Blocked(reason, hint="lower serving.concurrency or serving.context_tokens, choose a smaller "
                                       "precision, or plan a larger accelerator (serving.gpu_memory_gib)")
        package = builds.package(cfg, name, report, candidate, validation)
        production = production_ref(self.registry, name, pipe.work_dir / "production", self.trust)
        if production is not None:
            report.production = {"version": production.version, "metrics": production.metrics}
        self._gates("before_register", gates, name, package, intake, report, production, None)
        self._check_required(report)
        if not gates:
            note = "released without gates: no gate is configured in release.yaml (gates:), so no evidence " \
                   "beyond validation was checked"
            report.notes.append(note)
            self.progress.note(note)
        if dry_run:
            report.outcome = "dry-run"
            return
        pause_point("register:before")
        later = gates_of_phase(gates, "after_register")
        under_canary = bool(later) and production is not None
        if self.cfg.require_approval and not later and self._still_waiting(run, name, report, production):
            return
        # require_approval: registered as `candidate` whatever the gates; production waits for relctl approve.
        registered = self._register(pipe, run, name, package, report, production,
                                    under_canary or self.cfg.require_approval, canary_next=under_canary)
        if registered is None:
            return
        if later:
            self._after_register(run, name, package, intake, report, production, registered, later)
        elif self.cfg.require_approval:
            self._await_approval(run, name, registered, report, production)
        freed = prune_released(pipe.work_dir)  # the registry holds the package now (release/pipeline/workdirs.py)
        if freed:
            self.progress.note(f"work folder: removed the fetched and merged checkpoints ({size(freed)}); a "
                               "re-run fetches them again and resumes the rest")

    def _check_precision_range(self, intake: IntakeResult) -> None:
        if self.cfg.convert.precision != "fp16" or not intake.fp16_overflow:
            return
        names = ", ".join(intake.fp16_overflow[:3]) + (" ..." if len(intake.fp16_overflow) > 3 else "")
        message = f"{len(intake.fp16_overflow)} tensor(s) hold values above fp16's 65504 ({names})"
        if self.cfg.convert.fp16_overflow == "refuse":
            raise InputError(message, hint="serve at fp32, int8 or int4, or set convert.fp16_overflow: warn")
        self.progress.note(f"{message}; they will be Inf at fp16 (convert.fp16_overflow: warn)")

    def _repo_anchor(self) -> Path:
        return self.config_path.parent if self.config_path else self.project_dir

    def _merge(self, pipe: Pipeline, intake: Done[IntakeResult]) -> tuple[Path, str]:
        checkpoint = intake.path(intake.result.checkpoint)
        if intake.result.summary.adapter is None or not self.cfg.merge.enabled:
            return checkpoint, intake.fingerprint
        merged = pipe.run(MergeStage(MergeInputs(upstream=intake.fingerprint, base=checkpoint, adapter=checkpoint)))
        return merged.path(merged.result.model), merged.fingerprint

    def _gates(self, phase: GatePhase, gates: list[Gate], name: str, package: PackageManifest,
               intake: Done[IntakeResult], report: ReleaseReport, production: ProductionRef | None,
               version: str | None) -> list[GateResult]:
        selected = gates_of_phase(gates, phase)
        if not selected:
            return []
        eval_data = intake.path(intake.result.eval_data) if intake.result.eval_data else None
        work = intake.dir.parent / "gates"

        def context_for(gate_id: str) -> GateContext:
            return GateContext(model_name=name, package_dir=package.root, work_dir=work / gate_id,
                               production=production, eval_dataset=eval_data, config_dir=self._repo_anchor(),
                               version=version, should_stop=self._stop_check(name, production, version),
                               project_dir=self.project_dir, load_reference=self.load_reference)

        measured: dict[str, GateResult] = {}
        if phase == "before_register" and self.engines is not None and not _replays_production(gates, production):
            load = self.engines.load_result_for(self.engines.chosen, report.package.get("content_sha256"))
            if load is not None:
                measured[load.gate] = load
        results = run_phase_gates(selected, context_for, self.progress, None, measured, self.keep_going)
        self.gate_results += results
        report.gates += [result_to_dict(r) for r in results]
        for result in results:
            report.plots |= {title: artifact for title, (_, artifact) in plot_artifacts(result).items()}
        self.gates_markdown = render_markdown(self.gate_results, production.version if production else None)
        failed = [r for r in results if blocks(r.status)]
        if failed and phase == "before_register":
            report.block([f"gate {r.gate}: {r.reason}" for r in failed])
            raise Blocked(f"gate '{failed[0].gate}' {_blocked_as(failed[0])}: {failed[0].reason}",
                          hint="see the release report for the evidence")
        return results

    def _check_required(self, report: ReleaseReport) -> None:
        statuses = {g["gate"]: g["status"] for g in report.gates}
        skipped = [g for g in self.cfg.require if statuses.get(g) == "skipped"]
        if skipped:
            why = next(g["reason"] for g in report.gates if g["gate"] == skipped[0])
            reason = f"required gate '{skipped[0]}' was skipped: {why}"
            report.block([reason])
            raise Blocked(reason, hint="a gate listed in require must run and pass")

    def _stop_check(self, name: str, production: ProductionRef | None, version: str | None) -> Any:
        if version is None:
            return None
        expected = production.version if production else None

        def should_stop() -> str | None:
            now = self.registry.aliases(name).get(PRODUCTION)
            return None if now == expected else f"production moved to v{now} (a rollback?) during the canary"

        return should_stop

    @staticmethod
    def _gate_tags(report: ReleaseReport) -> dict[str, str]:
        """One status tag per gate; the gates' numbers are metrics (release_metrics), never tags."""
        return {T.gate_status(gate["gate"]): str(gate["status"]) for gate in report.gates}

    def _record(self, name: str, version: str, run: ReleaseRun, report: ReleaseReport) -> None:
        """Gate statuses onto the version, its new numbers onto its LoggedModel, the card as its description."""
        self.registry.set_version_tags(name, version, self._gate_tags(report))
        new = self._unrecorded(report)
        self.registry.record_numbers(self.registry.get_version(name, version), run.run_id, new,
                                     release_details(report))
        self.recorded |= new
        self.registry.set_description(name, version, self.card(report))

    def _unrecorded(self, report: ReleaseReport) -> dict[str, float]:
        return {k: v for k, v in release_metrics(report).items() if self.recorded.get(k) != v}

    def _register(self, pipe: Pipeline, run: ReleaseRun, name: str, package: PackageManifest, report: ReleaseReport,
                  production: ProductionRef | None, under_canary: bool, canary_next: bool = True) -> str | None:
        report.outcome = "released"
        inputs = reg.RegisterInputs(
            model=name, content_sha256=report.package["content_sha256"], lineage=report.lineage,
            extra_tags=self._gate_tags(report), numbers=release_metrics(report), details=release_details(report),
            evidence_sha256=evidence_digests(self.gate_results),
            description=self.card(report),
            target="candidate" if under_canary else "production",
            waits_for="the canary" if canary_next else "an approval: relctl approve",
            reason=f"promoted from training run {report.training_run}",
            expected_production=production.version if production else None, package_dir=package.root)
        done = pipe.run(reg.RegisterStage(inputs, self.registry, run, package, self.signer,
                                          require_approval=self.cfg.require_approval))
        result = done.result
        if result.outcome != "unchanged":
            self.recorded |= inputs.numbers
        for note in result.notes:
            self.progress.note(note)
        report.version, report.outcome = result.version, result.outcome
        if result.outcome == "unchanged":
            if report.gates:  # new evidence for what already serves: recorded, never dropped
                report.version = result.version
                report.outcome = "re-gated"  # before _record: the card written on the version says so
                self._regated(name, result.version, run, package, report)
                self._record(name, result.version, run, report)
                transitions.regated(self.registry, name, f"gates re-run on v{result.version}: " + ", ".join(
                    f"{g['gate']} {g['status']}" for g in report.gates), run.run_id)
                self.progress.note(f"{name} v{result.version} already serves this package; "
                                   "the new gate results are recorded on it (history: re-gated)")
            return None
        report.aliases = result.aliases
        self.registry.set_description(name, result.version, self.card(report))
        return result.version

    def _regated(self, name: str, version: str, run: ReleaseRun, package: PackageManifest,
                 report: ReleaseReport) -> None:
        """This run gated `version` again: it becomes the version's release run (its report, gates and numbers
        are the ones that count) and joins the version's release runs; the first, which registered the
        package and holds it, stays first. The run carries the lineage too, so it is read on its own."""
        tags = self.registry.get_version(name, version).tags
        runs = T.with_release_run(tags, run.run_id)
        run.set_tags(reg.lineage_tags(report.lineage, package))
        self.registry.set_version_tags(name, version, {T.RELEASE_RUN: run.run_id, T.RELEASE_RUNS: runs})
        report.release_runs = runs.split(",")

    def _after_register(self, run: ReleaseRun, name: str, package: PackageManifest, intake: Done[IntakeResult],
                        report: ReleaseReport, production: ProductionRef | None, version: str,
                        later: list[Gate]) -> None:
        if production is None:
            for gate in later:
                skipped = GateResult(gate=gate.id, status="skipped", reason="no production version (first release)")
                self.gate_results.append(skipped)
                report.gates.append(result_to_dict(skipped))
            self.gates_markdown = render_markdown(self.gate_results, None)
            if self.cfg.require_approval:
                self._await_approval(run, name, version, report, production)
                return
            self._record(name, version, run, report)
            return
        try:
            pause_point("canary:running")
            results = self._gates("after_register", later, name, package, intake, report, production, version)
        except BaseException as exc:  # SIGTERM, Ctrl-C, a crash: the version must not stay half-released
            self._unwind(name, version, run, report, exc)
            raise
        stopped = [r for r in results if r.details.get("outcome") == "stopped"]
        if stopped:  # a rollback won during the canary: stopped, not rejected, and the promote says so
            why = str(stopped[0].details.get("reason") or stopped[0].reason)
            for entry in report.gates:
                entry["status"] = "stopped" if entry["gate"] == stopped[0].gate else entry["status"]
            transitions.unwind(self.registry, name, version, f"canary stopped: {why}", run.run_id)
            self._record(name, version, run, report)
            raise ProductionMoved(f"{name}: canary of v{version} stopped: {why}; v{version} was registered "
                                  "but not promoted (tagged stopped)",
                                  hint="production changed under this release (a rollback?); re-run relctl "
                                       "promote to gate the candidate against the new production")
        failed = [r for r in results if blocks(r.status)]
        if failed:
            reason = f"gate {failed[0].gate}: {failed[0].reason}"
            transitions.reject(self.registry, name, version, reason, run.run_id)
            report.block([f"gate {r.gate}: {r.reason}" for r in failed])
            self._record(name, version, run, report)
            raise Blocked(f"gate '{failed[0].gate}' {_blocked_as(failed[0])}: {failed[0].reason}",
                          hint="production was never moved; see the release report for the evidence")
        if self.cfg.require_approval:  # the canary passed; production waits for the approval
            self._await_approval(run, name, version, report, production)
            return
        move, notes = transitions.promote(self.registry, name, version, "canary passed", run.run_id,
                                          expected_production=production.version, clear_candidate=True,
                                          action="canary")
        for note in notes:
            self.progress.note(note)
        report.aliases, report.outcome = (move.changes if move else {}), "released"
        self._record(name, version, run, report)

    def _still_waiting(self, run: ReleaseRun, name: str, report: ReleaseReport,
                       production: ProductionRef | None) -> bool:
        """This very package already waits for an approval (a re-run promote, a repeated dispatch): the new
        gate results go onto that version, which stays the one to approve, instead of a twin beside it."""
        if not self.registry.model_exists(name):
            return False
        waiting = [v for v in self.registry.find_versions(name, T.CONTENT_SHA256, report.package["content_sha256"])
                   if v.tags.get(T.RELEASE_STATE) == AWAITING_APPROVAL]
        if not waiting:
            return False
        version = str(waiting[-1].version)
        report.version = version
        transitions.nominate(self.registry, name, version, "candidate",
                             f"re-gated while waiting for an approval (training run {report.training_run})",
                             run.run_id)
        self._await_approval(run, name, version, report, production)
        return True

    def _await_approval(self, run: ReleaseRun, name: str, version: str, report: ReleaseReport,
                        production: ProductionRef | None) -> None:
        """Every gate passed: the version waits as `candidate` until relctl approve (release/pipeline/approve.py).
        The production it was compared with is recorded: an approval after production moved is refused."""
        transitions.await_approval(self.registry, name, version, production.version if production else None)
        report.outcome = "awaiting-approval"
        note = (f"{name} v{version} passed its gates and waits for an approval (require_approval): production "
                f"does not move until `relctl approve {name}/{version} --reason ...`")
        report.notes.append(note)
        self.progress.note(note)
        self._record(name, version, run, report)

    def _unwind(self, name: str, version: str, run: ReleaseRun, report: ReleaseReport, exc: BaseException) -> None:
        """The canary was cut short by `exc`: unwind the version (canary.outcome) and say what is left."""
        try:
            transitions.unwind(self.registry, name, version, f"canary interrupted: {classify(exc).message}",
                               run.run_id)
            note = (f"{name} v{version} was registered; its canary was interrupted: candidate removed, version "
                    "tagged stopped; re-run the same command to canary it again")
        except Exception as failure:  # what the user must see is `exc`; this only says what is left
            note = (f"{name} v{version} was registered and its canary interrupted, but it could not be unwound "
                    f"({classify(failure).message}); the next promote of this run resumes it")
        report.notes.append(note)
        self.progress.note(note)
        if isinstance(exc, ReleaseError | Terminated):
            exc.hint = note

    def _log_report(self, run: ReleaseRun, report: ReleaseReport) -> None:
        self._count_reference(report)
        if self.pipeline is not None:
            report.stages = {n: {"seconds": round(d.seconds, 3), "resumed": d.resumed}
                             for n, d in self.pipeline.done.items()}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
            (out / "model_card.md").write_text(self.card(report))
            (out / "summary.md").write_text(summary_markdown(report, self.gates_markdown))
            (out / Path(DETAILS_ARTIFACT).name).write_text(details_markdown(report, self.gates_markdown))
            (out / Path(REPORT_ARTIFACT).name).write_text(
                release_page(report, self.gate_results, self._card_sections(report)))
            run.log_artifacts(out, "report")
        self._say_where(run, report)
        for result in self.gate_results:
            log_result(run, result, metrics=False)
        # Once: what the version's LoggedModel did not already record through this run.
        run.log_metrics(self._unrecorded(report))
        run.set_tags({T.OUTCOME: report.outcome})

    def _say_where(self, run: ReleaseRun, report: ReleaseReport) -> None:
        """Where the release report is: its MLflow UI link, and the file when the artifact store is local."""
        link = report.links.get(REPORT_LINK)
        local = run.local_artifact(REPORT_ARTIFACT)
        file = str(local) if local is not None and local.is_file() else None
        if link and file:
            self.progress.info(f"report: {link} (file: {file})")
        elif link or file:
            self.progress.info(f"report: {link or file}")


def _replays_production(gates: list[Gate], production: ProductionRef | None) -> bool:
    """Whether the release's load gate would also replay its plan against production (evidence the engines
    comparison, which runs before production is looked up, does not have): then it runs again."""
    config = getattr(load_gate(gates), "config", None)
    return (production is not None and bool(getattr(config, "compare_production", False))
            and not getattr(config, "sweep", None))


def _blocked_as(result: GateResult) -> str:
    """How a blocking gate reads in the one-line error: "failed", or its own status ("underpowered")."""
    return "failed" if result.status == "fail" else f"did not pass ({result.status})"
