"""A KServe InferenceService for one pinned model version, from the template its backend names
(templates/kserve-inferenceservice.yaml: served by `relctl serve`; an engine that is its own server names its own).

The template is parsed as YAML and its `${...}` placeholders are filled in string values only, so a model
name can never change the manifest's structure; mode, resources, scheduling, replicas, canary share, probes
and cache size are set on the parsed structure, from the version's deployment as its backend decides it
(release/deploy/facts.py, `Backend.deployment`: the device it was validated on, image, args, env, memory)
and the options. A device the version was not validated on is refused unless --allow-unvalidated-device,
and then the manifest says so (annotation relctl/unvalidated-device).

Deployment modes (KServe's `serving.kserve.io/deploymentMode`): Serverless (Knative) rolls a new spec out as
a new revision and splits traffic with canaryTrafficPercent; RawDeployment (a plain Deployment) has no
traffic split, so a canary share is refused there and a rollout is a surge (a new replica first, on its
own devices, as the memory plan assumes by default) and no unavailable one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import yaml

from release import __version__
from release.backends.base import Deployment
from release.core.errors import InputError
from release.core.escape import terminal
from release.core.jsonfile import parse_yaml
from release.core.templates import template_text
from release.deploy.facts import VersionFacts
from release.deploy.pinning import check_kserve_options, plain_yaml
from release.registry.refs import PINNED, parse_version

if TYPE_CHECKING:  # the adapters module reads the registry: loaded only for a render with adapters
    from release.deploy.kserve_adapters import AdapterPin

PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")
# KServe names an InferenceService's Knative services and routes after it: a DNS-1035 label, and short
# enough for its "-predictor" suffixes.
NAME_MAX = 45
Mode = Literal["serverless", "raw"]
MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
UNVALIDATED_ANNOTATION = "relctl/unvalidated-device"
MODES: dict[str, str] = {"serverless": "Serverless", "raw": "RawDeployment"}
GIB = 1024**3
MIB = 1024**2
# Scheduling onto GPU nodes: the label NVIDIA's GPU operator (GPU feature discovery) puts on every GPU node,
# and the taint managed GPU node pools (GKE, AKS, EKS with the GPU operator) put on them so that other
# pods stay off. --node-selector replaces the label with your own.
GPU_NODE_LABEL = {"nvidia.com/gpu.present": "true"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PROBE_PERIOD = 10


@dataclass(frozen=True)
class KServeOptions:
    """What `relctl render kserve` sets besides the model and version."""

    image: str
    name: str | None = None
    namespace: str | None = None
    secret: str = "relctl-mlflow"
    mode: Mode = "serverless"
    canary_percent: int | None = None
    cpu: str = "1"
    memory_gib: float | None = None            # None: the version's memory plan
    gpus: int | None = None                    # None: 1 when validated on cuda, else 0
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] | None = field(default=None)   # None: GPU_NODE_LABEL on a GPU manifest
    engine_image: str | None = None            # an engine that is its own server: its image (default: its own)
    allow_unvalidated_device: bool = False     # render for a device the version was not validated on
    trusted_keys: str = "relctl-trusted-keys"  # ConfigMap with the release's public key (release.pub)
    modelcar: bool = False                     # the OCI digest as KServe's storageUri (ModelCar), not a pull
    cache_gib: float = 10.0
    min_replicas: int = 1
    max_replicas: int = 1
    startup_seconds: int = 600


def parse_version_spec(spec: str) -> tuple[str, str]:
    """`MODEL/VERSION` or `models:/MODEL/VERSION` -> (model, version); an alias is refused (not pinned). A name
    reaches manifests, OCI annotations and file names: the one rule first (release/registry/refs.py)."""
    return parse_version(spec, PINNED)


def service_name(model: str) -> str:
    """A DNS-1035 name for `model`: lower case, '-' for anything else, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = f"m-{name}".rstrip("-")
    return name[:NAME_MAX].rstrip("-")


def check_options(options: KServeOptions) -> None:
    """Every problem with the options alone, before the registry is read."""
    gpus = options.gpus or 0
    problems = [
        (not options.image.strip(), "--image: empty", "pass the image built from templates/Dockerfile"),
        (options.canary_percent is not None and not 0 <= options.canary_percent <= 100,
         f"--canary-percent {options.canary_percent}: not within 0..100", "e.g. --canary-percent 10"),
        (options.canary_percent is not None and options.mode == "raw",
         "--canary-percent: KServe's RawDeployment mode has no traffic split (canaryTrafficPercent is Serverless only)",
         "use --mode serverless for a canary share, or run the candidate as its own InferenceService and judge it "
         "with relctl canary --candidate-url"),
        (options.memory_gib is not None and (not math.isfinite(options.memory_gib) or options.memory_gib <= 0),
         f"--memory-gib {options.memory_gib}: must be positive",
         "leave it out to use the version's memory plan, or pass e.g. --memory-gib 6"),
        (gpus < 0, f"--gpus {options.gpus}: must be 0 or more", "e.g. --gpus 1"),
        (options.min_replicas < 0 or options.max_replicas < max(1, options.min_replicas),
         f"--min-replicas {options.min_replicas} / --max-replicas {options.max_replicas}: max must be >= min and >= 1",
         "e.g. --min-replicas 1 --max-replicas 3"),
        (not re.fullmatch(r"\d+(\.\d+)?m?", options.cpu), f"--cpu {options.cpu}: not a CPU quantity",
         "e.g. --cpu 2 or --cpu 500m"),
    ]
    for failed, message, hint in problems:
        if failed:
            raise InputError(message, hint=hint)
    check_kserve_options(options)  # every Kubernetes name and image reference (release/deploy/pinning.py)


def render_kserve(spec: str | VersionFacts, options: KServeOptions, template: str | None = None,
                  adapters: list[AdapterPin] | None = None) -> dict[str, Any]:
    """The InferenceService for `spec` as a dict, ready for yaml.safe_dump. `spec`: the version's facts as
    read from the registry, or MODEL/VERSION alone (then --memory-gib must be given: no plan is known).
    `adapters`: LoRA adapters served beside it, each pinned by digest (release/deploy/kserve_adapters.py)."""
    facts = spec if isinstance(spec, VersionFacts) else VersionFacts(*parse_version_spec(spec))
    check_options(options)
    model, version = facts.model, facts.version
    validated = facts.deployment().validated_device
    gpus = options.gpus if options.gpus is not None else (1 if validated == "cuda" else 0)
    device = "cuda" if gpus else "cpu"
    deployment = facts.deployment(device)
    unvalidated = _check_device(facts, deployment, device, gpus, options)
    _check_modelcar(facts, deployment, options)
    memory = _memory(facts, deployment, options)
    name = options.name or service_name(model)
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > NAME_MAX:
        raise InputError(f"--name {name}: not a valid InferenceService name",
                         hint=f"lower-case letters, digits and '-', starting with a letter, at most {NAME_MAX}")
    if template is None:
        template = template_text(deployment.template)
    source = facts.oci_uri or f"{model}/{version}"
    values = {"NAME": name, "MODEL": model, "VERSION": version, "IMAGE": options.image, "SECRET": options.secret,
              "RELCTL_IMAGE": options.image, "SOURCE": source, "TRUSTED_KEYS": options.trusted_keys}
    if deployment.own_engine:
        values["IMAGE"] = str(options.engine_image or deployment.engine_image)
    try:
        manifest: dict[str, Any] = _fill(parse_yaml(template, "--template", "fix the template"), values)
        predictor = manifest["spec"]["predictor"]
        container = predictor["containers"][0]
        # The places set below must exist in a user's own copy of the template too.
        for place in (manifest["metadata"]["annotations"], container["livenessProbe"], container["startupProbe"],
                      predictor["volumes"][0]["emptyDir"]):
            if not isinstance(place, dict):
                raise TypeError(f"{place!r} is not a mapping")
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise InputError(f"KServe template: not an InferenceService with one predictor container, probes "
                         f"(startup, liveness) and a cache volume ({type(exc).__name__}: {exc})",
                         hint=f"start from relctl's templates/{deployment.template}") from exc
    metadata = manifest["metadata"]
    if options.namespace:
        metadata["namespace"] = options.namespace
    annotations = metadata["annotations"]
    annotations["relctl/rendered-by"] = f"relctl {__version__}"
    annotations[MODE_ANNOTATION] = MODES[options.mode]
    if unvalidated:
        annotations[UNVALIDATED_ANNOTATION] = unvalidated
    predictor["minReplicas"], predictor["maxReplicas"] = options.min_replicas, options.max_replicas
    predictor.pop("canaryTrafficPercent", None)
    if options.mode == "serverless" and options.canary_percent is not None:
        predictor["canaryTrafficPercent"] = options.canary_percent
    if options.mode == "raw":
        # A Deployment's rolling update: the new replica starts beside the old one, which serves until then.
        predictor["deploymentStrategy"] = {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    container["resources"] = {"requests": {"cpu": options.cpu, "memory": memory}, "limits": {"memory": memory}}
    if gpus:
        for kind in ("requests", "limits"):
            container["resources"][kind][options.gpu_resource] = str(gpus)
        predictor["nodeSelector"] = dict(options.node_selector or GPU_NODE_LABEL)
        predictor["tolerations"] = [dict(GPU_TOLERATION, key=options.gpu_resource)]
    elif options.node_selector:
        predictor["nodeSelector"] = dict(options.node_selector)
    container["startupProbe"]["periodSeconds"] = PROBE_PERIOD
    container["startupProbe"]["failureThreshold"] = max(1, math.ceil(options.startup_seconds / PROBE_PERIOD))
    container["livenessProbe"].pop("initialDelaySeconds", None)
    predictor["volumes"][0]["emptyDir"]["sizeLimit"] = _gib(options.cache_gib)
    _engine_settings(container, deployment)
    if deployment.init_verifies:
        pass  # the template's own init container fetches and verifies SOURCE before the engine starts
    elif facts.oci_uri and options.modelcar:
        _modelcar(container, facts)
    elif facts.oci_uri:
        _pull_from_oci(predictor, container, facts, options)
    if facts.oci_uri:
        annotations["relctl/storage-uri"] = facts.oci_uri
    if adapters:
        from release.deploy.kserve_adapters import add_adapters  # noqa: PLC0415 - adapters only

        add_adapters(manifest, adapters, facts.backend, options.image, deployment.own_engine)
    return manifest


def render_kserve_yaml(spec: str | VersionFacts, options: KServeOptions, template: str | None = None,
                       adapters: list[AdapterPin] | None = None) -> str:
    """The manifest as YAML text, headed by a comment naming what it serves (and, in Serverless mode, the
    Knative features it needs)."""
    manifest = render_kserve(spec, options, template, adapters)
    annotations = manifest["metadata"]["annotations"]
    header = terminal(f"# relctl render kserve {annotations['relctl/model']}/{annotations['relctl/version']} "
                      f"({MODES_LABEL[annotations[MODE_ANNOTATION]]}; relctl {__version__})") + "\n"
    features = knative_features(manifest)
    if features:
        header += (f"# Knative rejects this spec unless its config-features ConfigMap (knative-serving) enables: "
                   f"{', '.join(features)}\n")
    return header + plain_yaml(manifest)  # no anchors or aliases: every value where it applies


# Pod spec fields Knative Serving (KServe's Serverless mode) refuses unless a feature flag enables them;
# a RawDeployment is a plain Deployment and takes them all.
KNATIVE_FEATURES = (("initContainers", "kubernetes.podspec-init-containers"),
                    ("nodeSelector", "kubernetes.podspec-nodeselector"),
                    ("tolerations", "kubernetes.podspec-tolerations"))


def knative_features(manifest: dict[str, Any]) -> list[str]:
    """The Knative feature flags a Serverless manifest needs; none for RawDeployment."""
    if manifest["metadata"]["annotations"].get(MODE_ANNOTATION) != MODES["serverless"]:
        return []
    predictor = manifest["spec"]["predictor"]
    return [flag for field_name, flag in KNATIVE_FEATURES if predictor.get(field_name)]


MODES_LABEL = {"Serverless": "KServe Serverless mode", "RawDeployment": "KServe RawDeployment mode"}


def _check_modelcar(facts: VersionFacts, deployment: Deployment, options: KServeOptions) -> None:
    label = f"{facts.model} v{facts.version}"
    if options.modelcar and not facts.oci_uri:
        raise InputError(f"--modelcar: {label} has not been published as an OCI artifact",
                         hint=f"relctl publish {facts.model}/{facts.version} --to oci://HOST/REPO --base "
                              "oci://HOST/busybox@sha256:... first")
    if options.modelcar and deployment.init_verifies:
        raise InputError(f"--modelcar: {label} is a {facts.backend} package, which relctl verifies in an init "
                         "container before the engine starts, and an init container cannot see a ModelCar's files",
                         hint="leave out --modelcar: the init container pulls the same digest and verifies it")


def _check_device(facts: VersionFacts, deployment: Deployment, device: str, gpus: int,
                  options: KServeOptions) -> str:
    """A package runs where its backend says it can, and by default only on the device it was validated on;
    the annotation text for a device it was not validated on (allowed explicitly), else ""."""
    label = f"{facts.model} v{facts.version}"
    validated = deployment.validated_device
    other = f"--gpus {gpus}" if gpus else "--gpus 0"
    if device not in deployment.runs_on:
        raise InputError(f"{label} {deployment.why_not or f'cannot run on {device}'}; {other} would not serve it "
                         f"(cannot run on {device})",
                         hint=f"render it for {', '.join(deployment.runs_on)} "
                              f"({'--gpus 1' if device == 'cpu' else '--gpus 0'}), or release it for {device} "
                              "(convert.execution_provider)")
    unvalidated = ""
    if validated not in ("unknown", device):
        if not options.allow_unvalidated_device:
            raise InputError(f"{label} was built and validated for {validated}, and {other} would run it on "
                             f"{device}, where it was never validated",
                             hint=f"render it for {validated} ({'--gpus 1' if validated == 'cuda' else '--gpus 0'}), "
                                  f"release it for {device}, or pass --allow-unvalidated-device (the manifest then "
                                  "says so)")
        unvalidated = f"{device} (validated on {validated} only)"
    if deployment.own_engine and not (options.engine_image or deployment.engine_image):
        raise InputError(f"{label}: the {facts.backend} engine has no default image for {device}",
                         hint=f"pass --engine-image with an image of its {device} build"
                              + (", or --gpus 1" if device == "cpu" else ""))
    return unvalidated


def _memory(facts: VersionFacts, deployment: Deployment, options: KServeOptions) -> str:
    """Request and limit per replica: --memory-gib, else what the backend derives from the version's plan."""
    if options.memory_gib is not None:
        return _gib(options.memory_gib)
    if deployment.memory_bytes is None:
        raise InputError(f"{facts.model} v{facts.version} has no memory plan recorded (memory.per_replica_bytes)",
                         hint="pass --memory-gib; `relctl plan` on its package gives the per-replica figure")
    return f"{math.ceil(deployment.memory_bytes / MIB)}Mi"


def _engine_settings(container: dict[str, Any], deployment: Deployment) -> None:
    """The backend's args and environment, where the template does not already set them."""
    args = [a for a in container.get("args", []) if isinstance(a, str)]
    extra = list(deployment.args)
    i = 0
    while i < len(extra):
        flag = extra[i]
        takes_value = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if flag not in args:
            args += extra[i:i + 2] if takes_value else [flag]
        i += 2 if takes_value else 1
    if args or "args" in container:
        container["args"] = args
    env = list(container.get("env") or [])
    named = {e.get("name") for e in env if isinstance(e, dict)}
    env += [{"name": key, "value": value} for key, value in deployment.env.items() if key not in named]
    if env:
        container["env"] = env


# KServe's ModelCar mounts the image's /models at /mnt/models (a link into the sidecar's filesystem). relctl
# serve reads a registered version from its cache (serve-cache/MODEL/VERSION under the project's state folder)
# after checking it against the registry's manifest digest and the release signature; the entrypoint copies
# the ModelCar's files there first (on the pod's own volume, no network): the signature check refuses a
# package reached through a link, and a copy is also what stays put if the sidecar restarts. --cached-only:
# files that differ from the released package are refused (exit 2, the file named), never replaced by a
# download from the registry's artifact store. "$1" is the container's MODEL/VERSION argument.
MODELCAR_ENTRYPOINT = ('cache="${RELCTL_PROJECT_DIR:-/var/cache/relctl}/.relctl/serve-cache/$1" && '
                       'rm -rf "$cache" && mkdir -p "$cache" && cp -R /mnt/models/. "$cache/" && '
                       'exec relctl serve --cached-only --host 0.0.0.0 --port "${PORT:-8080}" '
                       '--project-dir "${RELCTL_PROJECT_DIR:-/var/cache/relctl}" "$@"')


def _modelcar(container: dict[str, Any], facts: VersionFacts) -> None:
    """The OCI digest as KServe's storageUri: a custom container names it in STORAGE_URI, and KServe runs the
    image as a ModelCar sidecar whose /models is the container's /mnt/models."""
    container["env"] = [*container.get("env", []), {"name": "STORAGE_URI", "value": str(facts.oci_uri)}]
    container["command"] = ["/bin/sh", "-c", MODELCAR_ENTRYPOINT, "relctl-serve"]


def _pull_from_oci(predictor: dict[str, Any], container: dict[str, Any], facts: VersionFacts,
                   options: KServeOptions) -> None:
    """relctl serve's package, from the OCI artifact pinned by digest: an init container pulls and verifies it
    (digest, manifest, signature) into the cache `relctl serve MODEL/VERSION` reads, which checks it once more
    against the registry's manifest digest instead of downloading it from the artifact store."""
    from release.registry.store import STATE_DIR  # noqa: PLC0415 - the cache path relctl serve reads

    mounts = container.get("volumeMounts") or []
    cache_mount = next((m["mountPath"] for m in mounts if m.get("name") == predictor["volumes"][0]["name"]),
                       "/var/cache/relctl")
    cache = f"{cache_mount}/{STATE_DIR}/serve-cache/{facts.model}/{facts.version}"
    # The same environment and volumes as relctl serve's (registry credentials, the trusted key).
    env = [e for e in container.get("env", []) if e.get("name") != "RELCTL_PROJECT_DIR"]
    predictor["initContainers"] = [{
        "name": "relctl-pull", "image": options.image,
        "command": ["relctl", "--project-dir", cache_mount, "pull", str(facts.oci_uri), "--to", cache,
                    "--model", facts.model, "--version", facts.version],
        "env": env, "volumeMounts": list(mounts),
    }]


def _fill(node: Any, values: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {key: _fill(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_fill(item, values) for item in node]
    if isinstance(node, str):
        return PLACEHOLDER.sub(lambda m: values[m.group(1)], node)
    return node


def _gib(value: float) -> str:
    """A Kubernetes quantity: whole GiB as `NGi`, else MiB rounded up."""
    if float(value).is_integer():
        return f"{int(value)}Gi"
    return f"{math.ceil(value * 1024)}Mi"
