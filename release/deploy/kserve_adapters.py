"""`relctl render kserve BASE/VERSION --adapters` (or `ADAPTER/VERSION`): the base's InferenceService with
its LoRA adapters, each pinned by digest (docs/adapters.md, docs/deploy.md).

Each adapter is the registered version's package as it was released, verified here (manifest digest recorded
at release, signature against the trusted keys, the signature vouching for that version) and bound by its
signed manifest to this base version and its base package (release/adapters/trust.py check_bound; the tags
only find the production adapters). The manifest pins it twice over:
- its source: the OCI digest its signed publication record vouches for (pinning.pinned_oci) once it was
  published, else MODEL/VERSION in the registry;
- its package content digest, computed from the verified package: the init container that fetches it runs
  `relctl pull SOURCE --sha256 DIGEST`, which verifies the package again and refuses any other content, so a
  re-registered or rewritten package never reaches the server.
The serving container then starts with the adapters under their registered model names (what clients send as
the OpenAI `model`), with the args its backend names (Backend.adapter_deploy_args): an engine that is its own
server gets the flags its adapter runner uses; relctl serve gets the pulled package folders, which it checks
against the base it loads once more. Runtime loading is left off: a pod serves what its manifest pins (no
admin key in the template); a new adapter version is a new revision.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.adapters.trust import KIND, BaseIdentity, check_bound, production_adapters
from release.backends import get_backend
from release.backends.base import AdapterMount
from release.core.errors import InputError
from release.core.hashing import sha256_file
from release.core.jsonfile import load_json
from release.core.package import MANIFEST, PackageManifest
from release.deploy.facts import version_manifest
from release.deploy.pinning import pinned_oci
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.registry.versions import fetch_verified
from release.signing.keys import Trust

ADAPTERS_ANNOTATION = "relctl/adapters"
PULL = "relctl-pull"
CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class AdapterPin:
    """One adapter version as a manifest pins it."""

    model: str
    version: str
    source: str            # oci://HOST/REPO@sha256:... (published) or MODEL/VERSION (the registry)
    content_sha256: str    # its verified package's content: what `relctl pull --sha256` insists on
    manifest_sha256: str   # its manifest's digest, as recorded at release
    rank: int

    def mount(self, root: str) -> AdapterMount:
        return AdapterMount(self.model, self.version, f"{root}/{self.model}", self.rank)

    def annotation(self) -> dict[str, str]:
        return {"model": self.model, "version": self.version, "source": self.source,
                "sha256": self.content_sha256, "manifest_sha256": self.manifest_sha256}


def base_of(registry: Registry, model: str, version: str) -> tuple[str, str, VersionRecord | None]:
    """(base model, base version, the adapter version named) for MODEL/VERSION: an adapter version renders
    its base with it; a base version renders itself (the adapter None). The base an adapter names here is
    found by its tags; adapter_pins checks its signed binding before anything is rendered."""
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
    each verified and checked to be bound to the base by its signed manifest."""
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
    identity = BaseIdentity.of_package(PackageManifest(Path(), version_manifest(registry, base)), base_model,
                                       base_version)
    with tempfile.TemporaryDirectory(prefix="relctl-render-adapters-") as tmp:
        return [_pin(registry, mv, identity, trust, Path(tmp)) for mv in sorted(versions, key=lambda v: v.name)]


def _pin(registry: Registry, mv: VersionRecord, base: BaseIdentity, trust: Trust, tmp: Path) -> AdapterPin:
    label = f"{mv.name} v{mv.version}"
    package, _ = fetch_verified(registry, mv.name, str(mv.version), tmp, mv, trust=trust)
    check_bound(package, label, base)
    config = load_json(package.model_dir / CONFIG, "re-release the adapter", label=f"{label}: model/{CONFIG}") \
        if (package.model_dir / CONFIG).is_file() else None
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or rank < 1:
        raise InputError(f"{label}: its package has no model/{CONFIG} with a LoRA rank r",
                         hint="re-release the adapter with relctl promote RUN --onto ...")
    source = pinned_oci(mv, trust) or f"{mv.name}/{mv.version}"
    return AdapterPin(mv.name, str(mv.version), source, package.content_sha256,
                      sha256_file(package.root / MANIFEST), rank)


def add_adapters(manifest: dict[str, Any], pins: list[AdapterPin], backend_id: str, relctl_image: str,
                 own_engine: bool) -> None:
    """Into the base's rendered manifest: one verifying pull per adapter (beside the base's, or modelled on the
    serving container when that is relctl serve and fetches its base itself), the serving container's
    adapter args, and an annotation listing every pin."""
    predictor = manifest["spec"]["predictor"]
    container = predictor["containers"][0]
    pulls = predictor.get("initContainers") or []
    puller = next((c for c in pulls if c.get("name") == PULL), None) or _puller(container, backend_id, relctl_image,
                                                                             own_engine)
    project_dir = puller["command"][puller["command"].index("--project-dir") + 1]
    root = f"{_mount_of(predictor, container, puller)}/adapters"
    for i, pin in enumerate(pins, 1):
        command = ["relctl", "--project-dir", project_dir, "pull", pin.source, "--to", f"{root}/{pin.model}",
                   "--model", pin.model]
        if pin.source.startswith("oci://"):
            command += ["--version", pin.version]   # the digest must be the one this version's record names
        command += ["--sha256", pin.content_sha256]
        pulls.append({**puller, "name": f"{PULL}-adapter-{i}", "command": command,
                      "env": list(puller.get("env") or []), "volumeMounts": list(puller.get("volumeMounts") or [])})
    predictor["initContainers"] = pulls
    flags = get_backend(backend_id).adapter_deploy_args([pin.mount(root) for pin in pins])
    container["args"] = [*(container.get("args") or []), *flags]
    manifest["metadata"]["annotations"][ADAPTERS_ANNOTATION] = json.dumps([p.annotation() for p in pins],
                                                                          sort_keys=True)


def _puller(container: dict[str, Any], backend_id: str, relctl_image: str, own_engine: bool) -> dict[str, Any]:
    """An init container like the serving container (relctl's image, its environment and volumes), running
    `relctl pull`; refused when the serving container is an engine's own (its template must bring one)."""
    deploy = get_backend(backend_id).deploy()
    if own_engine:  # relctl is not in the engine's image
        raise InputError(f"--adapters: the template has no {PULL} init container to fetch the adapters with",
                         hint=f"start from relctl's {Path(deploy.kserve_template).name} (templates/, as relctl init "
                              "writes it)")
    env = [e for e in container.get("env") or [] if isinstance(e, dict)]
    project = next((e.get("value") for e in env if e.get("name") == "RELCTL_PROJECT_DIR"), None)
    mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, dict)]
    if not isinstance(project, str) or not project:
        project = mounts[0]["mountPath"] if mounts else "/var/cache/relctl"
    return {"name": PULL, "image": relctl_image, "command": ["relctl", "--project-dir", project],
            "env": [e for e in env if e.get("name") != "RELCTL_PROJECT_DIR"], "volumeMounts": mounts}


def _mount_of(predictor: dict[str, Any], container: dict[str, Any], puller: dict[str, Any]) -> str:
    """Where the serving container sees the predictor's first volume (the one the pulls write to)."""
    volume = predictor["volumes"][0]["name"]
    for mount in [*(container.get("volumeMounts") or []), *(puller.get("volumeMounts") or [])]:
        if isinstance(mount, dict) and mount.get("name") == volume:
            return str(mount["mountPath"])
    raise InputError(f"--adapters: the serving container does not mount the volume {volume} the pulls write to",
                     hint="mount the template's first volume in its serving container")
