"""The build stages of one release wired to the Pipeline: reference, convert, validate, memory and package.

Every method takes the configuration it builds for as an argument: the release's own, or one entry of
`engines:` (release/pipeline/comparison.py), so the same stages build each engine of a comparison and the
engine taken resumes from the same folders, without any shared configuration being swapped meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.backends import Backend, get_backend
from release.backends.base import LoadedModel
from release.config import ReleaseConfig
from release.core.errors import InputError
from release.core.hashing import sha256_file
from release.core.package import MANIFEST, PackageManifest, verify_package
from release.gating.reference import ReferenceModel, cache_dir_of
from release.pipeline.report import ReleaseReport
from release.pipeline.runner import Done, Pipeline
from release.stages import register as reg
from release.stages.convert import ConvertInputs, ConvertOutputs, ConvertStage
from release.stages.intake import IntakeResult
from release.stages.memory import MemoryInputs, MemoryResult, MemoryStage, memory_settings
from release.stages.package import PackageInputs, PackageStage
from release.stages.reference import ReferenceInputs, ReferenceResult, ReferenceStage
from release.stages.validate import ValidateInputs, ValidateResult, ValidateStage


@dataclass(frozen=True)
class Builds:
    """What every build of one release starts from: the fetched run and the (merged) checkpoint."""

    pipe: Pipeline
    intake: Done[IntakeResult]
    checkpoint: Path     # the checkpoint the engines build from: merged when the run holds an adapter
    upstream: str        # the fingerprint of the stage that produced `checkpoint`
    config_dir: Path     # release.yaml's folder: relative paths in it resolve here, never the process's cwd

    def convert(self, cfg: ReleaseConfig, backend: Backend) -> tuple[Done[Any], Done[ConvertOutputs]]:
        """(reference, candidate): the checkpoint's own numbers or an fp32 build, and the build at cfg's
        precision (one build when that is fp32)."""
        conv = cfg.convert
        block = conv.engine_settings(backend.id)
        settings = block.model_dump(mode="json") if block is not None else {}

        def stage(precision: str, label: str) -> ConvertStage:
            return ConvertStage(ConvertInputs(upstream=self.upstream, precision=precision, backend=backend.id,
                                              execution_provider=conv.execution_provider,
                                              checkpoint=self.checkpoint, engine_settings=settings), label=label)

        if backend.reference_from_checkpoint:
            # The checkpoint's own numbers, computed once (release/stages/reference.py); one build.
            prompts = self.prompts(cfg)
            reference: Done[Any] = self.pipe.run(ReferenceStage(ReferenceInputs(
                upstream=self.upstream, backend=backend.id, prompts_sha256=sha256_file(prompts),
                max_new_tokens=cfg.validation.max_new_tokens, checkpoint=self.checkpoint, prompts_path=prompts)))
            return reference, self.pipe.run(stage(conv.precision, "convert"))
        built = self.pipe.run(stage("fp32", "reference"))
        if conv.precision == "fp32":
            return built, built
        return built, self.pipe.run(stage(conv.precision, "convert"))

    def prompts(self, cfg: ReleaseConfig) -> Path:
        vcfg = cfg.validation
        intake = self.intake
        prompts = self._resolve(vcfg.prompts) if vcfg.prompts else (
            intake.path(intake.result.prompts) if intake.result.prompts else None)
        if prompts is None:
            raise InputError(f"run '{intake.result.lineage['training']['run_id']}' has no validation prompts",
                             hint="log validation/prompts.jsonl with the run or set validation.prompts in release.yaml")
        return prompts

    def validate(self, cfg: ReleaseConfig, reference: Done[Any],
                 candidate: Done[ConvertOutputs]) -> Done[ValidateResult]:
        prompts = self.prompts(cfg)
        reference_dir = reference.dir if isinstance(reference.result, ReferenceResult) else \
            reference.path(reference.result.model)
        return self.pipe.run(ValidateStage(ValidateInputs(
            reference=reference.fingerprint, candidate=candidate.fingerprint, prompts_sha256=sha256_file(prompts),
            thresholds=cfg.validation, reference_dir=reference_dir,
            candidate_dir=candidate.path(candidate.result.model), prompts_path=prompts,
            backend=candidate.result.backend, tokenizer=self.checkpoint / "tokenizer.json")))

    def memory(self, cfg: ReleaseConfig, candidate: Done[ConvertOutputs]) -> Done[MemoryResult]:
        return self.pipe.run(MemoryStage(MemoryInputs(
            candidate=candidate.fingerprint, settings=memory_settings(cfg.serving),
            backend=candidate.result.backend, runtime_dir=candidate.path(candidate.result.model),
            config_path=self.checkpoint / "config.json")))

    def package(self, cfg: ReleaseConfig, name: str, report: ReleaseReport, candidate: Done[ConvertOutputs],
                validation: Done[ValidateResult]) -> PackageManifest:
        """The package, verified whether built now or resumed (gates serve it, register publishes it); its
        digests into `report.package`."""
        c = candidate.result
        fields = {"model_name": name, "precision": cfg.convert.precision,
                  "exporter": {"exporter": c.backend, "versions": c.versions},
                  "lineage": report.lineage, "serving": cfg.serving.model_dump(), "validation": report.validation}
        out = self.pipe.run(PackageStage(PackageInputs(validation=validation.fingerprint, backend=c.backend,
                                                       fields=fields, link_model=True,
                                                       runtime_dir=candidate.path(c.model),
                                                       source_dir=self.checkpoint)))
        manifest = verify_package(out.path(out.result.package))
        report.package = {"manifest_sha256": sha256_file(manifest.root / MANIFEST),
                          "content_sha256": reg.content_sha256(manifest),
                          "serving_config_hash": manifest.serving_config_hash, "files": len(manifest.files),
                          "backend": manifest.backend_id}
        return manifest

    def _resolve(self, value: str) -> Path:
        path = Path(value)
        return path if path.is_absolute() else self.config_dir / path


def reference_loader(reference: Done[Any], candidate: Done[ConvertOutputs],
                     checkpoint: Path) -> Callable[[], LoadedModel]:
    """Opens the fp32 reference validation compared with, as a model gates can run: the merged checkpoint
    through the backend's load_reference when the reference is the checkpoint's own numbers (reference.npz
    holds summaries, not a model), else the fp32 build."""
    backend = get_backend(candidate.result.backend)
    folder = checkpoint if isinstance(reference.result, ReferenceResult) else reference.path(reference.result.model)
    # What gates compute on it is kept by its content digest beside the stage folders (scored once per release).
    return ReferenceModel(folder, backend.load_reference, cache_dir_of(reference.dir.parent))
