"""Package: what gets served. The runtime model folder, the source config and a checksummed manifest.

Layout of a package folder:
    model/               everything onnxruntime-genai loads: model.onnx(+.data), genai_config.json, tokenizer
    source/              the training checkpoint's config.json / generation_config.json, for traceability
    relctl-package.json  manifest: sha256 of every other file, lineage, precision, serving config hash
Checksums are verified before a package is served or rolled back to (`verify_package`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from release.errors import InputError
from release.hashing import sha256_file, sha256_json, sha256_tree
from release.stages.base import Stage, StageInputs, StageResult, location, output_folder

MANIFEST = "relctl-package.json"
FORMAT = 1
SOURCE_FILES = ("config.json", "generation_config.json")


@dataclass(frozen=True)
class PackageManifest:
    root: Path
    data: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def files(self) -> dict[str, str]:
        files: dict[str, str] = self.data["files"]
        return files

    @property
    def serving_config_hash(self) -> str:
        return str(self.data["serving_config_hash"])

    @property
    def model_name(self) -> str:
        return str(self.data.get("model_name", ""))


def build_package(
    out_dir: Path,
    model_dir: Path,
    source_dir: Path,
    fields: dict[str, Any],
) -> PackageManifest:
    """Copy the runtime model and source config into `out_dir` and write the manifest last.

    `fields` carries model_name, precision, exporter, lineage and serving (the serving config);
    the serving config hash covers it together with genai_config.json, the runtime's own config.
    """
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp / "model")
    (tmp / "source").mkdir()
    for name in SOURCE_FILES:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, tmp / "source" / name)
    runtime_cfg_path = tmp / "model" / "genai_config.json"
    runtime_cfg = json.loads(runtime_cfg_path.read_text()) if runtime_cfg_path.is_file() else {}
    data = {
        "format": FORMAT,
        **fields,
        "serving_config_hash": sha256_json({"serving": fields.get("serving", {}), "runtime": runtime_cfg})[:16],
        "files": sha256_tree(tmp),
    }
    (tmp / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True))
    # The package appears whole or not at all.
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return PackageManifest(root=out_dir, data=data)


def verify_package(root: Path, manifest_sha256: str | None = None) -> PackageManifest:
    """Read the manifest and check every file's sha256; raise InputError on any difference.

    `manifest_sha256` is the digest the registry recorded when the version was released: a manifest
    rewritten to match changed files no longer matches it, so the check is anchored outside the package.
    """
    path = root / MANIFEST
    if not path.is_file():
        raise InputError(f"{root}: not a relctl package ({MANIFEST} missing)", hint="build it with relctl promote")
    if manifest_sha256 is not None and sha256_file(path) != manifest_sha256:
        raise InputError(
            f"{root.name}: {MANIFEST} differs from the manifest recorded in the registry when it was released",
            hint="the package was rewritten after release; restore it from the release run or re-promote",
        )
    data = json.loads(path.read_text())
    actual = sha256_tree(root, exclude=frozenset({MANIFEST}))
    expected: dict[str, str] = data["files"]
    for rel, digest in expected.items():
        if rel not in actual:
            raise InputError(f"{root.name}: {rel} is missing from the package", hint="re-download or rebuild it")
        if actual[rel] != digest:
            raise InputError(
                f"{root.name}: {rel} does not match its sha256 in {MANIFEST}",
                hint="the package was modified after it was built; rebuild it or restore the original",
            )
    extra = sorted(set(actual) - set(expected))
    if extra:
        raise InputError(f"{root.name}: {extra[0]} is not listed in {MANIFEST}", hint="remove files added by hand")
    return PackageManifest(root=root, data=data)


class PackageInputs(StageInputs):
    validation: str = Field(description="fingerprint of the validated candidate")
    # model_name, precision, exporter, lineage, serving, validation: all recorded in the manifest.
    fields: dict[str, Any]
    into: str = "package"
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
        manifest = build_package(target, self.inputs.runtime_dir, self.inputs.source_dir, self.inputs.fields)
        return PackageResult(package=self.inputs.into, files=len(manifest.files),
                             serving_config_hash=manifest.serving_config_hash)

    def summary(self, result: PackageResult) -> str:
        return f"{result.files} files, serving config {result.serving_config_hash}"
