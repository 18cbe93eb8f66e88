"""An adapter release: a LoRA from a training run released onto the base version that already serves,
without merging (docs/adapters.md).

  1. the base, by content (seconds, tags only): base_match.match_base; the engine can serve adapters at
     the base's precision (Backend.adapter_problem); both before any download;
  2. intake: the run's checkpoint, checked as every release checks it; its base weights must hash to the
     digest the run recorded (a tag is a claim; the bytes are the evidence), or, when it recorded none, to
     the base version's (base_match.prove_base: the run holds the base weights, the tag only refuses faster);
  3. build for the base's engine and precision (Backend.export_adapter);
  4. validate as served: base + adapter in the engine against the merged fp32 reference;
  5. register: its own registered model, a version linked to the base version by tags, a signed package
     of the adapter alone, `production` moved per adapter; with `gates.canary` configured and a production
     version to compare with, registered as `candidate` and judged on the running base first
     (release/adapters/canary.py), the canary's outcome moving the aliases; with `require_approval`,
     registered as `candidate` waiting for `relctl approve` (production unmoved until then; a running
     `relctl serve BASE --adapters` follows the approval's move as any production move).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from release.adapters.base_match import BaseMatch, match_base, prove_base
from release.adapters.canary import plan_canary, run_release_canary
from release.adapters.package import AdapterPackaging
from release.adapters.target import BaseTarget
from release.adapters.validation import adapter_thresholds, validate_adapter
from release.backends import get_backend
from release.config import ReleaseConfig
from release.core.errors import Blocked, InputError
from release.core.model_name import check_model_name
from release.core.package import build_package
from release.core.progress import Progress
from release.core.weights_digest import base_digest
from release.registry import PRODUCTION, Registry, transitions
from release.registry import tags as T
from release.registry.kinds import ADAPTER, name_problem
from release.registry.states import AWAITING_APPROVAL
from release.registry.versions import fetch_package
from release.signing.keys import SigningKey, Trust
from release.stages.intake import IntakeInputs, IntakeResult, IntakeStage
from release.stages.lineage import checkpoint_lineage, training_lineage
from release.stages.register import RegisterInputs, RegisterStage, content_sha256
from release.stages.validate import load_prompts

KIND = "adapter"


@dataclass
class AdapterReport:
    """What an adapter release did, for --json and the progress lines."""

    model: str
    run_id: str
    base: dict[str, str]
    outcome: str = "refused"
    version: str | None = None
    backend: str | None = None
    precision: str | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    release_run: str | None = None
    canary: dict[str, Any] | None = None   # the canary's gate-shaped report, when one ran

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def adapter_model_name(given: str | None, base_model: str, run_experiment: str) -> str:
    """The adapter's registered model: the name given, else `<base>-<experiment>` (the experiment that trained
    it), else `<base>-adapter` when the run was logged under the base's own experiment."""
    if given:
        return check_model_name(given, "--model")
    suffix = run_experiment if run_experiment and run_experiment != base_model else "adapter"
    return check_model_name(f"{base_model}-{suffix}", "the adapter's model name (set it with --model)")


def release_adapter(registry: Registry, run_id: str, target: BaseTarget, cfg: ReleaseConfig, work: Path,
                    trust: Trust, signer: SigningKey | None, progress: Progress, name: str | None = None,
                    dry_run: bool = False, canary_server: str | None = None, config_dir: Path | None = None
                    ) -> AdapterReport:
    """Release the LoRA adapter of training run `run_id` onto the base `target`; Blocked (exit 1) when its
    validation fails, InputError (exit 2) for a base it does not belong to, before any download.
    `canary_server`: the base server a configured canary runs on (report.outcome `canary-fail` etc. when
    the candidate does not pass; the caller decides the exit)."""
    started = time.monotonic()
    match = match_base(registry, run_id, target)
    run = registry.get_run(run_id)
    model = adapter_model_name(name, match.model, registry.experiment_name(run.experiment_id))
    wrong_kind = name_problem(registry, model, ADAPTER)  # never into a whole model's name (as check says)
    if wrong_kind is not None:
        raise InputError(wrong_kind[0], hint=wrong_kind[1])
    report = AdapterReport(model=model, run_id=run_id, base={"model": match.model, "version": match.version,
                                                             "sha256": match.base_sha256})
    backend = get_backend(match.base_version.tags.get(T.BACKEND) or "")
    precision = match.base_version.tags.get(T.PRECISION, "")
    problem = backend.adapter_problem(precision)
    if problem:
        raise InputError(f"{match.model} v{match.version} serves on {backend.id} {precision}: {problem}",
                         hint="release the run merged (relctl promote RUN), or re-release the base on an "
                              "engine that serves adapters (relctl backends; docs/adapters.md)")
    report.backend, report.precision = backend.id, precision
    plan = plan_canary(registry, model, cfg, canary_server, (match.model, match.version), config_dir)
    prompts_file = _configured_prompts(cfg, config_dir)  # a wrong path fails here, before any download
    report.seconds["base_match"] = round(time.monotonic() - started, 3)
    progress.done("base", report.seconds["base_match"],
                  f"run trained on {match.base_sha256[:19]}…, which {match.model} v{match.version} serves"
                  if match.proven else f"{match.model} v{match.version} is a base; the run logged no base digest "
                                       f"({T.TRAINING_BASE_SHA256}): its checkpoint's is computed at intake")

    with progress.stage("intake"):
        t = time.monotonic()
        intake = IntakeStage(IntakeInputs(run_id=run_id, artifact_path=cfg.source.artifact_path), registry)
        fetched = intake.run(work / "intake")
        checkpoint = work / "intake" / fetched.checkpoint
        match = _check_intake(registry, fetched, match, run_id)
        report.seconds["intake"] = round(time.monotonic() - t, 3)
    with progress.stage("base package"):
        base_package = fetch_package(registry, match.model, match.version, work / "base", trust=trust,
                                     warn=progress.note)
    with progress.stage("export"):
        t = time.monotonic()
        exported = work / "adapter"
        backend.export_adapter(checkpoint, base_package.model_dir, exported)
        report.seconds["export"] = round(time.monotonic() - t, 3)
    with progress.stage("validate"):
        t = time.monotonic()
        prompts = load_prompts(prompts_file or _logged_prompts(work / "intake", fetched))
        thresholds = adapter_thresholds(cfg.validation)
        verdict = validate_adapter(backend, base_package.model_dir, exported, checkpoint, prompts, thresholds)
        report.validation = verdict.model_dump(mode="json")
        report.seconds["validate"] = round(time.monotonic() - t, 3)
    if not verdict.passed:
        report.outcome = "blocked"
        raise Blocked(f"{model}: adapter on {match.model} v{match.version} as {backend.id} serves it differs from "
                      f"the merged fp32 reference: {'; '.join(verdict.failures)}",
                      hint="the engine's LoRA path disagrees with the merge (docs/adapters.md); nothing registered")
    lineage = {"training": training_lineage(run), "checkpoint": _adapter_lineage(checkpoint, match)}
    fields = {"model_name": model, "precision": precision, "lineage": lineage, "kind": KIND,
              "serving": cfg.serving.model_dump(mode="json"),
              "base": {"model": match.model, "version": match.version, "sha256": match.base_sha256,
                       "package_content_sha256": match.base_version.tags.get(T.CONTENT_SHA256, "")},
              "validation": {"metrics": verdict.metrics, "passed": True}}
    packaging = AdapterPackaging(backend, match.base_version.tags.get(T.CONTENT_SHA256, ""))
    package = build_package(work / "package", exported, checkpoint, fields, packaging)
    if dry_run:
        report.outcome = "dry-run"
        return report
    with progress.stage("register"):
        t = time.monotonic()
        extra = {T.KIND: KIND, T.BASE_MODEL: match.model, T.BASE_VERSION: match.version,
                 T.BASE_SHA256: match.base_sha256, T.ADAPTER_SHA256: lineage["checkpoint"]["adapter_digest"]}
        with registry.release_run(model, f"adapter {model} onto {match.model} v{match.version}",
                                  {T.OUTCOME: "releasing", T.TRAINING_RUN: run_id}) as release:
            card = _card(model, match, backend.id, precision, verdict.metrics)
            waits = cfg.require_approval  # (with gates.canary: refused by policy.py, before anything ran)
            gated_against = registry.version_for(model, PRODUCTION) if registry.model_exists(model) else None
            inputs = RegisterInputs(model=model, content_sha256=content_sha256(package), lineage=lineage,
                                    extra_tags=extra, description=card,
                                    numbers={f"validation.{k}": v for k, v in verdict.metrics.items()},
                                    reason=f"adapter released onto {match.model} v{match.version}",
                                    target="candidate" if plan or waits else "production",
                                    waits_for=f"its canary on {plan.server}" if plan else "relctl approve",
                                    package_dir=package.root)
            result = RegisterStage(inputs, registry, release, package, signer, "relctl promote --onto",
                                   require_approval=waits).run(work / "register")
            report.version, report.outcome = result.version, result.outcome
            report.release_run = release.run_id
            report.seconds["register"] = round(time.monotonic() - t, 3)
            if plan is not None and result.outcome == "candidate":
                t = time.monotonic()
                with progress.stage("canary"):
                    report.canary = run_release_canary(registry, plan, model, result.version, work / "canary",
                                                       release.run_id, progress.note)
                report.outcome = "released" if report.canary["passed"] else f"canary-{report.canary['outcome']}"
                report.seconds["canary"] = round(time.monotonic() - t, 3)
            elif waits and result.outcome == "candidate":
                # The production it passed against is recorded: an approval after production moved is refused.
                transitions.await_approval(registry, model, result.version,
                                           str(gated_against.version) if gated_against else None)
                report.outcome = AWAITING_APPROVAL
                progress.note(f"{model} v{result.version} waits for an approval (require_approval): production "
                              f"does not move until `relctl approve {model}/{result.version} --reason ...`")
            release.set_tags({T.OUTCOME: report.outcome})
    report.seconds["total"] = round(time.monotonic() - started, 3)
    return report


def _check_intake(registry: Registry, fetched: IntakeResult, match: BaseMatch, run_id: str) -> BaseMatch:
    """The run's adapter and base weights as fetched: the base weights' digest is the evidence (a tag the run
    logged must agree with it; without one it is the run's only word); the match, proven."""
    if fetched.summary.adapter is None:
        raise InputError(f"run '{run_id}' logged no adapter (adapter_config.json + adapter_model.safetensors in "
                         "its checkpoint/)", hint="an adapter release needs the PEFT adapter; promote a whole "
                                                   "model without --onto")
    weights = fetched.lineage["checkpoint"]["weights_sha256"]
    found = base_digest(weights)
    if not match.proven:
        return prove_base(registry, run_id, match, found, "its checkpoint's base weights")
    if found != match.base_sha256:
        raise InputError(f"run '{run_id}': its checkpoint's base weights hash to {found}, not to the "
                         f"{match.base_sha256} its tag {T.TRAINING_BASE_SHA256} claims",
                         hint="log the tag from the weights the adapter trained on (relctl digest DIR)")
    return match


def _adapter_lineage(checkpoint: Path, match: BaseMatch) -> dict[str, Any]:
    from release.core import checkpoint as ckpt  # noqa: PLC0415 - small, but only here

    lineage = checkpoint_lineage(checkpoint, ckpt.weight_files(checkpoint))
    # The version's base is the base version's digest; the adapter is not merged into anything.
    lineage["base_sha256"], lineage["merged_adapter_sha256"] = match.base_sha256, None
    lineage["adapter_digest"] = base_digest(lineage["adapter_sha256"])
    return lineage


def _configured_prompts(cfg: ReleaseConfig, config_dir: Path | None) -> Path | None:
    """release.yaml's validation.prompts, resolved against release.yaml's folder (as a merged release's are),
    never the process's cwd; None: the run's own logged prompts are used."""
    if not cfg.validation.prompts:
        return None
    path = Path(cfg.validation.prompts)
    path = path if path.is_absolute() else (config_dir or Path.cwd()) / path
    if not path.is_file():
        raise InputError(f"validation.prompts: {path} is not a file",
                         hint="fix the path in release.yaml (relative paths are read from its folder)")
    return path


def _logged_prompts(intake_dir: Path, fetched: IntakeResult) -> Path:
    if fetched.prompts is None:
        raise InputError("the run logged no validation/prompts.jsonl", hint="log it, or set validation.prompts")
    return intake_dir / fetched.prompts


def _card(model: str, match: BaseMatch, backend: str, precision: str, metrics: dict[str, float]) -> str:
    figures = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("top1_agreement", "mean_kl", "greedy_agreement")
                        if k in metrics)
    return (f"# {model} — LoRA adapter on {match.model} v{match.version}\n\nServed unmerged by **{backend}** on "
            f"the base at **{precision}** (base digest `{match.base_sha256}`). Validated as served against the "
            f"merged fp32 reference: {figures}.")

