"""What a manifest needs to know about a registered version, read from the registry before anything is written.

`relctl render kserve MODEL/VERSION` sizes, schedules and starts the deployment from the version itself: its
backend, the device its package was built for, its memory plan and, once published, its OCI digest. The
package's own files are read without downloading the package: the manifest (relctl-package.json), checked
against the digest the registry recorded at release, and the one or two small config files the manifest
lists, each checked against its sha256 there. A version that does not exist, or whose manifest does not
match, is refused (exit 2) before a line of the manifest is written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.backends.vllm import built_for as vllm_built_for
from release.core.errors import InputError
from release.core.hashing import sha256_file
from release.core.jsonfile import load_json
from release.core.package import LEGACY_BACKEND, MANIFEST, load_manifest_data
from release.pipeline.versions import package_uri
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord

# The memory plan's per-replica figure, as the release logged it (release/stages/memory.py).
PER_REPLICA = f"{T.MEMORY_PREFIX}per_replica_bytes"
VLLM = "vllm"
# vLLM's dtypes (config.json) that only its CUDA build serves here (relctl builds fp16 for cuda only; bf16 and
# fp32 for either, recorded in the package's config.json).
GPU_ONLY_DTYPES = frozenset({"float16"})


@dataclass(frozen=True)
class VersionFacts:
    """One registered version as a deployment sees it."""

    model: str
    version: str
    backend: str = LEGACY_BACKEND
    # The device the package was built for: "cuda" (a CUDA build) or "cpu"; "unknown" when only MODEL/VERSION
    # is known (nothing is refused then). vLLM's safetensors load on either; its fp16 packages only on CUDA.
    provider: str = "cpu"
    per_replica_bytes: int | None = None
    oci_uri: str | None = None                 # oci://HOST/REPO@sha256:..., set by `relctl publish`
    max_model_len: int | None = None           # vLLM: from the package's config.json
    dtype: str | None = None                   # vLLM: as the package stores its weights

    @property
    def gpu_capable(self) -> bool:
        return self.provider in ("cuda", "unknown") or self.backend == VLLM

    @property
    def cpu_capable(self) -> bool:
        return self.provider in ("cpu", "unknown") and not (self.backend == VLLM and self.dtype in GPU_ONLY_DTYPES)


def read_version_facts(registry: Registry, model: str, version: str) -> VersionFacts:
    """The facts of `model` v`version`; InputError (exit 2) when it does not exist or its manifest does not match."""
    mv = registry.get_version(model, version)   # InputError "not found" for a version that does not exist
    metrics, _ = registry.recorded_numbers(mv)
    per_replica = metrics.get(PER_REPLICA)
    backend = mv.tags.get(T.BACKEND) or LEGACY_BACKEND
    files = _package_files(registry, mv, backend)
    oci = mv.tags.get(T.OCI_DIGEST) or None
    if backend == VLLM:
        config = files.get("model/config.json", {})
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        context = config.get("max_position_embeddings")
        return VersionFacts(model, version, backend, vllm_built_for(config),
                            int(per_replica) if per_replica else None, oci,
                            int(context) if isinstance(context, int) else None, dtype)
    return VersionFacts(model, version, backend, _genai_provider(files.get("model/genai_config.json", {})),
                        int(per_replica) if per_replica else None, oci)


def _genai_provider(genai_config: dict[str, Any]) -> str:
    """onnxruntime-genai names the execution provider it was built for in its session options."""
    options = genai_config.get("model", {}).get("decoder", {}).get("session_options", {})
    providers = [name for entry in options.get("provider_options", []) for name in entry]
    return "cuda" if "cuda" in providers else "cpu"


def _package_files(registry: Registry, mv: VersionRecord, backend: str) -> dict[str, dict[str, Any]]:
    """The package's small config files, verified: the manifest against the registry's digest, each file
    against the manifest. Only these are downloaded, never the weights."""
    label = f"{mv.name} v{mv.version}"
    uri = package_uri(dict(mv.tags))
    anchor = mv.tags.get(T.MANIFEST_SHA256)
    if not uri or not anchor:
        raise InputError(f"{label} was not released by relctl (no {T.RELEASE_RUN} or {T.MANIFEST_SHA256} tag)",
                         hint="render a version that relctl promote or relctl register recorded")
    wanted = ("model/config.json",) if backend == VLLM else ("model/genai_config.json",)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="relctl-render-") as tmp:
        (Path(tmp) / "manifest").mkdir()
        manifest_path = registry.download_uri(f"{uri}/{MANIFEST}", Path(tmp) / "manifest")
        if sha256_file(manifest_path) != anchor:
            raise InputError(f"{label}: {MANIFEST} differs from the manifest recorded in the registry at release",
                             hint=f"relctl verify {mv.name}/{mv.version} names what changed")
        listed: dict[str, str] = load_manifest_data(manifest_path)["files"]
        for rel in wanted:
            if rel not in listed:
                continue
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            local = registry.download_uri(f"{uri}/{rel}", (Path(tmp) / rel).parent)
            if sha256_file(local) != listed[rel]:
                raise InputError(f"{label}: {rel} does not match its sha256 in {MANIFEST}",
                                 hint=f"relctl verify {mv.name}/{mv.version} names what changed")
            out[rel] = load_json(local, "rebuild the package", label=f"{label}: {rel}")
    return out
