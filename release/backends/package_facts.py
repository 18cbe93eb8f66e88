"""What a built package tells the memory plan, through the backend that built it: its config.json (source/
or model/), its weights' bytes, precision, KV-cache dtype and the device it was built for, read from its
files by that backend (`Backend.memory_facts`), never assumed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.backends import backend_for_folder, backend_of
from release.core.errors import InputError
from release.core.package import MANIFEST, read_manifest


@dataclass(frozen=True)
class PackageFacts:
    """The measured side of a package: `weights_bytes` as its backend counts them (the bytes a replica loads)."""

    root: Path
    model_dir: Path
    config: dict[str, Any]
    weights_bytes: int
    precision: str
    kv_dtype_bytes: int
    provider: str
    backend: str  # the backend that built it: the memory plan is that engine's


def read_package(path: Path) -> PackageFacts:
    """A relctl package (model/ + source/config.json) or a converted folder holding config.json."""
    if not path.exists():
        raise InputError(f"{path}: no such package or config.json", hint="pass a package folder or a config.json")
    model_dir = path / "model" if (path / "model").is_dir() else path
    config_path = next((p for p in (path / "source" / "config.json", model_dir / "config.json") if p.is_file()), None)
    if config_path is None:
        raise InputError(f"{path}: the package has no config.json (looked in source/ and model/)",
                         hint="rebuild it with relctl package, which copies the checkpoint's config.json "
                              "into source/")
    manifest = path / MANIFEST
    declared: str | None = None
    if manifest.is_file():
        package = read_manifest(path)
        backend, declared = backend_of(package), package.data.get("precision")
    else:
        backend = backend_for_folder(model_dir)
    # The backend reads its own files: initializer bytes of an ONNX graph, safetensors sizes, ...
    facts = backend.memory_facts(model_dir, declared)
    return PackageFacts(root=path, model_dir=model_dir, config=_read_config(config_path),
                        weights_bytes=facts.weights_bytes, precision=facts.precision,
                        kv_dtype_bytes=facts.kv_dtype_bytes, provider=facts.provider,
                        backend=backend.id)


def _read_config(path: Path) -> dict[str, Any]:
    from release.core.jsonfile import load_json_object  # noqa: PLC0415

    data = load_json_object(path, "pass a Hugging Face config.json", str(path))
    return data


def read_config_file(path: Path) -> dict[str, Any]:
    """A Hugging Face config.json given on its own (planning before anything is built)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="pass a package folder or a config.json")
    return _read_config(path)
