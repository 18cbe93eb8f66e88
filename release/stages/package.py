"""Package: the runtime model folder, the source config and a checksummed manifest (format:
release/core/package.py), built by the backend that converted the candidate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from release.backends import backend_for_folder
from release.core.package import build_package
from release.stages.base import Stage, StageInputs, StageResult, location, output_folder


class PackageInputs(StageInputs):
    validation: str = Field(description="fingerprint of the validated candidate")
    backend: str = Field("auto", description="id of the backend that built the runtime folder (auto: the installed "
                                             "backend whose runtime files it holds)")
    # model_name, precision, lineage, serving, validation: all recorded in the manifest.
    fields: dict[str, Any]
    into: str = "package"
    # True when runtime_dir is a stage output of the same promote (relctl's own, never edited after it is
    # built): the package's model files are hard links to it instead of a second copy on disk. A folder a
    # user hands `relctl package` is always copied.
    link_model: bool = False
    runtime_dir: Path = location()
    source_dir: Path = location()


class PackageResult(StageResult):
    package: str
    files: int
    serving_config_hash: str


class PackageStage(Stage[PackageInputs, PackageResult]):
    """The runtime model, the source config and a manifest with sha256 of every file."""

    name = "package"
    result_type = PackageResult

    def run(self, out: Path) -> PackageResult:
        target = output_folder(out, self.inputs.into)
        backend = backend_for_folder(self.inputs.runtime_dir, self.inputs.backend)
        manifest = build_package(target, self.inputs.runtime_dir, self.inputs.source_dir, self.inputs.fields, backend,
                                 link_model=self.inputs.link_model)
        return PackageResult(package=self.inputs.into, files=len(manifest.files),
                             serving_config_hash=manifest.serving_config_hash)

    def summary(self, result: PackageResult) -> str:
        return f"{result.files} files, serving config {result.serving_config_hash}"
