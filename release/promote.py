"""`relctl promote`: intake → merge → convert → validate → package → gates → register.

Aliases move only at the very end, after every check passed, so a failed or blocked promote
changes no alias. Each attempt is a release run in MLflow holding its report, whatever the outcome.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow

from release.config import ReleaseConfig
from release.errors import EXIT_BUG, Blocked, ReleaseError
from release.hashing import sha256_file
from release.lineage import repo_state
from release.pipeline import Pipeline, StageOutcome
from release.progress import Progress
from release.registry import PREVIOUS, PRODUCTION, Registry
from release.report import ReleaseReport, model_card, summary_markdown
from release.stages import register as reg
from release.stages.intake import run_intake
from release.stages.package import MANIFEST, PackageManifest, build_package, verify_package
from release.store import Store, ensure_experiment

RELEASE_EXPERIMENT = "relctl-releases"


class Promotion:
    def __init__(self, cfg: ReleaseConfig, store: Store, project_dir: Path, config_path: Path | None,
                 progress: Progress) -> None:
        self.cfg = cfg
        self.store = store
        self.registry = Registry(store)
        self.project_dir = project_dir
        self.config_path = config_path
        self.progress = progress
        self.gate_results: list[Any] = []
        self.gates_markdown: str | None = None
        self.pipeline: Pipeline | None = None

    def card(self, report: ReleaseReport) -> str:
        """The model card: lineage, validation, memory, then the gate table and a link to the HTML report."""
        sections = []
        if self.gates_markdown:
            link = f"release run `{report.release_run}`, artifact `report/report.html`"
            sections = [self.gates_markdown.replace("### relctl gates", "## Gates"), f"Full gate report: {link}."]
        return model_card(report, sections)

    def run(self, run_id: str, dry_run: bool, summary_path: Path | None = None) -> ReleaseReport:
        from gates.registry import load_gates  # gates validate their config blocks before any work

        gates = load_gates(self.cfg.gates)
        training = self.registry.get_run(run_id)
        name = self.cfg.model or self.registry.client.get_experiment(training.info.experiment_id).name
        report = ReleaseReport(model=name, training_run=run_id, release_run=None,
                               precision=self.cfg.convert.precision)
        mlflow.set_experiment(experiment_id=ensure_experiment(self.store, RELEASE_EXPERIMENT))
        with mlflow.start_run(run_name=f"promote {name} from {run_id[:8]}") as release_run:
            report.release_run = release_run.info.run_id
            mlflow.set_tags({"relctl.training_run_id": run_id, "relctl.model": name,
                             "mlflow.note.content": f"relctl promote of training run {run_id}"})
            mlflow.log_params({"precision": self.cfg.convert.precision, "exporter": self.cfg.convert.exporter,
                               "dry_run": dry_run})
            try:
                self._stages(training, name, report, gates, dry_run)
            except BaseException as exc:
                if isinstance(exc, ReleaseError):
                    exc.report = report
                if not isinstance(exc, Blocked):
                    report.outcome = "error"
                    report.exit_code = getattr(exc, "exit_code", EXIT_BUG)
                    report.failures.append(getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
                raise
            finally:
                self._log_report(report)
                if summary_path is not None:
                    with summary_path.open("a") as fh:
                        fh.write(summary_markdown(report, self.gates_markdown))
        return report

    # ------------------------------------------------------------------------------------------
    def _stages(self, training: Any, name: str, report: ReleaseReport, gates: list[Any], dry_run: bool) -> None:
        cfg = self.cfg
        work = (self.project_dir / ".relctl" / "work" / training.info.run_id).resolve()
        pipe = self.pipeline = Pipeline(work, self.progress)
        intake = pipe.run("intake", {"run": training.info.run_id, "artifact": cfg.source.artifact_path},
                          lambda d: run_intake(self.registry, training, cfg.source.artifact_path, d),
                          _summ_intake)
        report.lineage = {**intake.outputs["lineage"], "release_repo": repo_state(self._repo_anchor())}
        model_dir, upstream = self._merge(pipe, intake)
        reference, candidate = self._convert(pipe, model_dir, upstream)
        validation = self._validate(pipe, intake, reference, candidate, model_dir)
        report.validation = validation.outputs["validation"]
        report.memory = validation.outputs["memory"]
        if not report.validation["passed"]:
            report.block(report.validation["failures"])
            raise Blocked(f"validation failed: {report.validation['failures'][0]}",
                          hint="see the release report; choose another precision or relax validation thresholds")
        package = self._package(pipe, name, report, candidate.path("model"), model_dir, validation)
        self._run_gates(gates, name, package, intake, report, pipe.work_dir)
        if dry_run:
            report.outcome = "dry-run"
            return
        self._register(name, package, report)

    def _repo_anchor(self) -> Path:
        return self.config_path.parent if self.config_path else self.project_dir

    def _merge(self, pipe: Pipeline, intake: StageOutcome) -> tuple[Path, str]:
        adapter = intake.outputs["summary"]["adapter"]
        checkpoint = intake.path("checkpoint")
        if adapter is None or not self.cfg.merge.enabled:
            return checkpoint, intake.fingerprint
        from release.stages.merge import merge_checkpoint

        def merge(d: Path) -> dict[str, Any]:
            result = merge_checkpoint(checkpoint, checkpoint, d / "model")
            return {"model": "model", "lora_modules": getattr(result, "lora_modules", None)}

        merged = pipe.run("merge", {"intake": intake.fingerprint}, merge,
                          lambda o: f"LoRA folded into the base ({o.get('lora_modules')} modules)")
        return merged.path("model"), merged.fingerprint

    def _convert(self, pipe: Pipeline, model_dir: Path, upstream: str) -> tuple[StageOutcome, StageOutcome]:
        from release.stages.convert import convert

        conv = self.cfg.convert

        def build(precision: str) -> Any:
            def fn(d: Path) -> dict[str, Any]:
                result = convert(model_dir, d / "model", precision, exporter=conv.exporter,  # type: ignore[arg-type]
                                 execution_provider=conv.execution_provider)
                return {"model": "model", "precision": precision, **_jsonable(result)}
            return fn

        inputs = {"upstream": upstream, "exporter": conv.exporter, "ep": conv.execution_provider}
        reference = pipe.run("reference", {**inputs, "precision": "fp32"}, build("fp32"),
                             lambda o: "fp32 reference ONNX")
        if conv.precision == "fp32":
            return reference, reference
        candidate = pipe.run("convert", {**inputs, "precision": conv.precision}, build(conv.precision),
                             lambda o: f"{o['precision']} ONNX via {o.get('exporter', '?')}")
        return reference, candidate

    def _validate(self, pipe: Pipeline, intake: StageOutcome, reference: StageOutcome, candidate: StageOutcome,
                  model_dir: Path) -> StageOutcome:
        from release.memory import estimate_memory, folder_kv_dtype_bytes, folder_weights_bytes
        from release.stages.validate import load_prompts, validate

        vcfg = self.cfg.validation
        prompts_path = Path(vcfg.prompts) if vcfg.prompts else (
            intake.path("prompts") if intake.outputs.get("prompts") else None)
        if prompts_path is None:
            from release.errors import InputError
            raise InputError(f"run '{intake.outputs['lineage']['training']['run_id']}' has no validation prompts",
                             hint="log validation/prompts.jsonl with the run or set validation.prompts in release.yaml")
        prompts = load_prompts(prompts_path)

        def fn(d: Path) -> dict[str, Any]:
            result = validate(reference.path("model"), candidate.path("model"), prompts,
                              model_dir / "tokenizer.json", vcfg)
            (d / "validation.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
            runtime = candidate.path("model")
            config = json.loads((model_dir / "config.json").read_text())
            memory = estimate_memory(config, folder_weights_bytes(runtime), self.cfg.serving,
                                     kv_dtype_bytes=folder_kv_dtype_bytes(runtime))
            return {"validation": result.to_dict(), "memory": memory.to_dict(), "report": "validation.json"}

        inputs = {"reference": reference.fingerprint, "candidate": candidate.fingerprint,
                  "prompts": sha256_file(prompts_path), "thresholds": vcfg.model_dump(),
                  "serving": self.cfg.serving.model_dump()}
        return pipe.run("validate", inputs, fn, _summ_validate)

    def _package(self, pipe: Pipeline, name: str, report: ReleaseReport, runtime_dir: Path, model_dir: Path,
                 validation: StageOutcome) -> PackageManifest:
        fields = {"model_name": name, "precision": self.cfg.convert.precision, "exporter": _exporter_info(pipe),
                  "lineage": report.lineage, "serving": self.cfg.serving.model_dump(),
                  "validation": report.validation}

        def fn(d: Path) -> dict[str, Any]:
            manifest = build_package(d / "package", runtime_dir, model_dir, fields)
            return {"package": "package", "files": len(manifest.files),
                    "serving_config_hash": manifest.serving_config_hash}

        out = pipe.run("package", {"validation": validation.fingerprint, "fields": fields}, fn,
                       lambda o: f"{o['files']} files, serving config {o['serving_config_hash']}")
        # Verified here, whether built now or resumed: gates serve it and register publishes it.
        manifest = verify_package(out.path("package"))
        report.package = {"manifest_sha256": sha256_file(manifest.root / MANIFEST),
                          # What is served (every file but the manifest): equal content, equal release.
                          "content_sha256": reg.content_sha256(manifest),
                          "serving_config_hash": manifest.serving_config_hash, "files": len(manifest.files)}
        return manifest

    def _run_gates(self, gates: list[Any], name: str, package: PackageManifest, intake: StageOutcome,
                   report: ReleaseReport, work: Path) -> None:
        if not gates:
            return
        from gates.report import render_markdown, result_to_dict
        from release.gating import run_configured_gates

        results, production = run_configured_gates(self.registry, gates, name, package, intake, work,
                                                   self.progress, self._repo_anchor())
        report.gates = [result_to_dict(r) for r in results]
        self.gate_results = results
        self.gates_markdown = render_markdown(results, production.version if production else None)
        failed = [r for r in report.gates if r["status"] == "fail"]
        if failed:
            report.block([f"gate {r['gate']}: {r['reason']}" for r in failed])
            raise Blocked(f"gate '{failed[0]['gate']}' failed: {failed[0]['reason']}",
                          hint="see the release report for the evidence")

    def _register(self, name: str, package: PackageManifest, report: ReleaseReport) -> None:
        assert report.release_run is not None
        start = time.perf_counter()
        current = self.registry.version_for(name, PRODUCTION) if self.registry.model_exists(name) else None
        if current is not None and current.tags.get(reg.CONTENT_TAG) == report.package["content_sha256"]:
            # Promoting what already serves is a no-op, not a new version that replaces its own twin.
            report.outcome, report.version = "unchanged", str(current.version)
            self.progress.done("register", time.perf_counter() - start,
                               f"{name} v{current.version} already serves this package; nothing moved")
            return
        extra: dict[str, Any] = {"relctl.package_manifest_sha256": report.package["manifest_sha256"]}
        extra |= {f"validation.{k}": v for k, v in (report.validation or {}).get("metrics", {}).items()
                  if isinstance(v, (int, float))}
        for gate in report.gates:
            extra[f"gate.{gate['gate']}.status"] = gate["status"]
            extra |= {f"gate.{gate['gate']}.{k}": v for k, v in gate.get("metrics", {}).items()}
            if "dataset_sha256" in gate.get("details", {}):
                extra[f"gate.{gate['gate']}.dataset_sha256"] = gate["details"]["dataset_sha256"]
        report.outcome = "released"
        version = reg.publish(self.registry, name, report.release_run, package, report.lineage, extra,
                              self.card(report))
        report.version = version
        move = self.registry.promote(name, version, f"promoted from training run {report.training_run}",
                                     report.release_run)
        report.aliases = move.changes
        self.registry.client.update_model_version(name, version, description=self.card(report))
        previous = move.changes.get(PREVIOUS, [None, None])[1]
        self.progress.done("register", time.perf_counter() - start, f"{name} v{version} is production"
                           + (f" (previous: v{previous})" if previous else ""))

    def _log_report(self, report: ReleaseReport) -> None:
        if self.pipeline is not None:
            report.stages = {n: {"seconds": round(o.seconds, 3), "resumed": o.resumed}
                             for n, o in self.pipeline.outcomes.items()}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
            (out / "model_card.md").write_text(self.card(report))
            (out / "summary.md").write_text(summary_markdown(report, self.gates_markdown))
            if self.gate_results:
                from gates.report import render_html

                meta = {"model": report.model, "training run": report.training_run,
                        "release run": str(report.release_run), "outcome": report.outcome}
                (out / "report.html").write_text(render_html(self.gate_results, meta))
            mlflow.log_artifacts(str(out), "report")
        metrics = {f"validation.{k}": float(v) for k, v in (report.validation or {}).get("metrics", {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if metrics:
            mlflow.log_metrics(metrics)
        mlflow.set_tag("relctl.outcome", report.outcome)


def _jsonable(result: Any) -> dict[str, Any]:
    data = result.to_dict() if hasattr(result, "to_dict") else {}
    return {k: v for k, v in data.items() if k not in ("out_dir", "model_dir")}


def _exporter_info(pipe: Pipeline) -> dict[str, Any]:
    outcome = pipe.outcomes.get("convert") or pipe.outcomes.get("reference")
    outputs = outcome.outputs if outcome else {}
    return {k: outputs[k] for k in ("exporter", "exporter_version", "versions") if k in outputs}


def _summ_intake(o: dict[str, Any]) -> str:
    s = o["summary"]
    adapter = s["adapter"]
    extra = f", {adapter['peft_type']} adapter r={adapter['r']}" if adapter else ", no adapter"
    return f"{s['model_type']} checkpoint, {s['tensors']} tensors, {s['weight_bytes'] / 1e6:.1f} MB{extra}"


def _summ_validate(o: dict[str, Any]) -> str:
    m = o["validation"].get("metrics", {})
    verdict = "pass" if o["validation"]["passed"] else "FAIL"
    return (f"{verdict}: top-1 {m.get('top1_agreement', float('nan')):.3f}, "
            f"KL {m.get('mean_kl', float('nan')):.2e}, greedy {m.get('greedy_agreement', float('nan')):.2f}")
