"""`relctl render kserve BASE/VERSION --adapters` (or `ADAPTER/VERSION`): the base's InferenceService with
its LoRA adapters, each pinned by digest (docs/adapters.md, docs/deploy.md).

Each adapter is the registered version as it was released and checked for this base (release/adapters/serving.py
check_adapter_for: built for this base version and its base-weights digest). The manifest pins it twice over:
- its source: the OCI digest its signed publication record vouches for (pinning.pinned_oci) once it was
  published, else MODEL/VERSION in the registry;
- its package content digest (relctl.package_content_sha256): the init container that fetches it runs
  `relctl pull SOURCE --sha256 DIGEST`, which verifies the package (manifest digest recorded at release,
  signature against the trusted keys) and refuses any other content, so a re-registered or rewritten package
  never reaches the engine.
The engine then starts with the adapters loaded under their registered model names (what clients send as the
OpenAI `model`), with the flags its own adapter runner uses (Backend.adapter_deploy_args). Runtime loading is
left off: a pod serves what its manifest pins; a new adapter version is a new revision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.adapters.serving import KIND, check_adapter_for, production_adapters
from release.backends import get_backend
from release.core.errors import InputError
from release.deploy.facts import package_files
from release.deploy.pinning import pinned_oci
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.signing.keys import Trust

ADAPTERS_ANNOTATION = "relctl/adapters"
ADAPTER_ROOT = "/mnt/models/adapters"
CONFIG = "model/adapter_config.json"


@dataclass(frozen=True)
class AdapterPin:
    """One adapter version as a manifest pins it."""

    model: str
    version: str
    source: str            # oci://HOST/REPO@sha256:... (published) or MODEL/VERSION (the registry)
    content_sha256: str    # relctl.package_content_sha256: what `relctl pull --sha256` insists on
    manifest_sha256: str   # relctl.package_manifest_sha256: what the pull checks the package against
    rank: int

    @property
    def package_dir(self) -> str:
        return f"{ADAPTER_ROOT}/{self.model}"

    @property
    def folder(self) -> str:
        """The adapter files the engine loads (the package's model/)."""
        return f"{self.package_dir}/model"

    def annotation(self) -> dict[str, str]:
        return {"model": self.model, "version": self.version, "source": self.source,
                "sha256": self.content_sha256, "manifest_sha256": self.manifest_sha256}


def base_of(registry: Registry, model: str, version: str) -> tuple[str, str, VersionRecord | None]:
    """(base model, base version, the adapter version named) for MODEL/VERSION: an adapter version renders
    its base with it; a base version renders itself (the adapter None)."""
    mv = registry.get_version(model, version)
    if mv.tags.get(T.KIND) != KIND:
        return model, version, None
    base_model, base_version = mv.tags.get(T.BASE_MODEL), mv.tags.get(T.BASE_VERSION)
    if not base_model or not base_version:
        raise InputError(f"{model} v{version} is an adapter that names no base version ({T.BASE_MODEL}, "
                         f"{T.BASE_VERSION})", hint="release it with relctl promote RUN --onto BASE@production")
    return base_model, base_version, mv


def adapter_pins(registry: Registry, base_model: str, base_version: str, chosen: VersionRecord | None,
                 trust: Trust) -> list[AdapterPin]:
    """The adapters the manifest serves: `chosen`, else the production adapters built for the base version;
    each checked against the base and its package files against the digest recorded at release."""
    base = registry.get_version(base_model, base_version)
    backend = get_backend(base.tags.get(T.BACKEND) or "")
    problem = backend.adapter_problem(base.tags.get(T.PRECISION, ""))
    if problem:
        raise InputError(f"--adapters: {base_model} v{base_version} serves on {backend.id}: {problem}",
                         hint="render the base alone (without --adapters)")
    versions = [chosen] if chosen is not None else list(production_adapters(registry, base_model,
                                                                            base_version).values())
    if not versions:
        raise InputError(f"--adapters: no production adapter is built for {base_model} v{base_version}",
                         hint=f"release one: relctl promote RUN --onto {base_model}/{base_version}; or render "
                              "without --adapters")
    pins = []
    for mv in sorted(versions, key=lambda v: v.name):
        check_adapter_for(mv, base_model, base_version, base.tags.get(T.BASE_SHA256))
        label = f"{mv.name} v{mv.version}"
        content, manifest = mv.tags.get(T.CONTENT_SHA256), mv.tags.get(T.MANIFEST_SHA256)
        if not content or not manifest:
            raise InputError(f"{label} records no package digest ({T.CONTENT_SHA256}), so it cannot be pinned",
                             hint="re-release the adapter with this relctl")
        config = package_files(registry, mv, (CONFIG,)).get(CONFIG)  # verified against the recorded manifest
        rank = config.get("r") if config else None
        if not isinstance(rank, int) or rank < 1:
            raise InputError(f"{label}: its package has no {CONFIG} with a LoRA rank r",
                             hint="re-release the adapter with relctl promote RUN --onto ...")
        source = pinned_oci(mv, trust) or f"{mv.name}/{mv.version}"
        pins.append(AdapterPin(mv.name, str(mv.version), source, content, manifest, rank))
    return pins


def add_adapters(manifest: dict[str, Any], pins: list[AdapterPin], backend_id: str) -> None:
    """Into the base's rendered manifest: one verifying pull per adapter (beside the base's), the engine's
    adapter flags, and an annotation listing every pin."""
    predictor = manifest["spec"]["predictor"]
    container = predictor["containers"][0]
    pulls = predictor.get("initContainers") or []
    base_pull = next((c for c in pulls if c.get("name") == "relctl-pull"), None)
    if base_pull is None:
        template = get_backend(backend_id).deploy().kserve_template
        raise InputError("--adapters: the template has no relctl-pull init container to fetch the adapters with",
                         hint=f"start from relctl's {Path(template).name} (templates/, as relctl init writes it)")
    project_dir = base_pull["command"][base_pull["command"].index("--project-dir") + 1]
    for i, pin in enumerate(pins, 1):
        command = ["relctl", "--project-dir", project_dir, "pull", pin.source, "--to", pin.package_dir,
                   "--model", pin.model]
        if pin.source.startswith("oci://"):
            command += ["--version", pin.version]   # the digest must be the one this version's record names
        command += ["--sha256", pin.content_sha256]
        pulls.append({**base_pull, "name": f"relctl-pull-adapter-{i}", "command": command,
                      "env": list(base_pull.get("env") or []),
                      "volumeMounts": list(base_pull.get("volumeMounts") or [])})
    predictor["initContainers"] = pulls
    flags = get_backend(backend_id).adapter_deploy_args({p.model: (p.folder, p.rank) for p in pins})
    container["args"] = [*(container.get("args") or []), *flags]
    manifest["metadata"]["annotations"][ADAPTERS_ANNOTATION] = json.dumps([p.annotation() for p in pins],
                                                                          sort_keys=True)
