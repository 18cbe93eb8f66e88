"""A KServe InferenceService for one pinned model version, from templates/kserve-inferenceservice.yaml.

The template is parsed as YAML and its `${...}` placeholders are filled in string values only, so a model
name can never change the manifest's structure; resources, replicas, canary share and cache size are set
on the parsed structure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from release import __version__
from release.core.errors import InputError
from release.core.templates import template_text

TEMPLATE = "kserve-inferenceservice.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")
# KServe names an InferenceService's Knative services and routes after it: a DNS-1035 label, and short
# enough for its "-predictor" suffixes.
NAME_MAX = 45


@dataclass(frozen=True)
class KServeOptions:
    """What `relctl render kserve` sets besides the model and version."""

    image: str
    name: str | None = None
    namespace: str | None = None
    secret: str = "relctl-mlflow"
    canary_percent: int | None = None
    cpu: str = "1"
    memory_gib: float = 4.0
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    cache_gib: float = 10.0
    min_replicas: int = 1
    max_replicas: int = 1
    startup_seconds: int = 300


def parse_version_spec(spec: str) -> tuple[str, str]:
    """`MODEL/VERSION` or `models:/MODEL/VERSION` -> (model, version); an alias is refused (not pinned)."""
    body = spec.removeprefix("models:/")
    model, sep, version = body.rpartition("/")
    if "@" in spec and not sep:
        raise InputError(f"{spec}: an alias is resolved when a pod starts, so it is not a pinned version",
                         hint="pass MODEL/VERSION; `relctl status MODEL` shows which version each alias points at")
    if not sep or not model or not version.isdigit():
        raise InputError(f"{spec}: expected MODEL/VERSION (or models:/MODEL/VERSION) with a numeric version",
                         hint="e.g. relctl render kserve tiny-llm/3")
    return model, version


def service_name(model: str) -> str:
    """A DNS-1035 name for `model`: lower case, '-' for anything else, starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if not name or not name[0].isalpha():
        name = f"m-{name}".rstrip("-")
    return name[:NAME_MAX].rstrip("-")


def render_kserve(spec: str, options: KServeOptions, template: str | None = None) -> dict[str, Any]:
    """The InferenceService for `spec` (MODEL/VERSION) as a dict, ready for yaml.safe_dump."""
    model, version = parse_version_spec(spec)
    _check(options)
    name = options.name or service_name(model)
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > NAME_MAX:
        raise InputError(f"--name {name}: not a valid InferenceService name",
                         hint=f"lower-case letters, digits and '-', starting with a letter, at most {NAME_MAX}")
    if template is None:
        template = template_text(TEMPLATE)
    values = {"NAME": name, "MODEL": model, "VERSION": version, "IMAGE": options.image, "SECRET": options.secret}
    try:
        manifest: dict[str, Any] = _fill(yaml.safe_load(template), values)
        predictor = manifest["spec"]["predictor"]
        container = predictor["containers"][0]
        # The places set below must exist in a user's own copy of the template too.
        for place in (manifest["metadata"]["annotations"], container["livenessProbe"],
                      predictor["volumes"][0]["emptyDir"]):
            if not isinstance(place, dict):
                raise TypeError(f"{place!r} is not a mapping")
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise InputError(f"KServe template: not an InferenceService with one predictor container, probes and a "
                         f"cache volume ({type(exc).__name__}: {exc})",
                         hint="start from relctl's templates/kserve-inferenceservice.yaml") from exc
    metadata = manifest["metadata"]
    if options.namespace:
        metadata["namespace"] = options.namespace
    metadata["annotations"]["relctl/rendered-by"] = f"relctl {__version__}"
    predictor["minReplicas"], predictor["maxReplicas"] = options.min_replicas, options.max_replicas
    if options.canary_percent is not None:
        predictor["canaryTrafficPercent"] = options.canary_percent
    memory = _gib(options.memory_gib)
    container["resources"] = {"requests": {"cpu": options.cpu, "memory": memory}, "limits": {"memory": memory}}
    if options.gpus:
        for kind in ("requests", "limits"):
            container["resources"][kind][options.gpu_resource] = str(options.gpus)
    container["livenessProbe"]["initialDelaySeconds"] = options.startup_seconds
    predictor["volumes"][0]["emptyDir"]["sizeLimit"] = _gib(options.cache_gib)
    return manifest


def render_kserve_yaml(spec: str, options: KServeOptions, template: str | None = None) -> str:
    """The manifest as YAML text, headed by a comment naming what it serves."""
    manifest = render_kserve(spec, options, template)
    model, version = parse_version_spec(spec)
    header = f"# relctl render kserve {model}/{version} (relctl {__version__})\n"
    return header + str(yaml.safe_dump(manifest, sort_keys=False, width=120))


def _check(options: KServeOptions) -> None:
    problems = [
        (not options.image.strip(), "--image: empty", "pass the image built from templates/Dockerfile"),
        (options.canary_percent is not None and not 0 <= options.canary_percent <= 100,
         f"--canary-percent {options.canary_percent}: not within 0..100", "e.g. --canary-percent 10"),
        (not math.isfinite(options.memory_gib) or options.memory_gib <= 0,
         f"--memory-gib {options.memory_gib}: must be positive",
         "pass the memory plan's per-replica figure, e.g. --memory-gib 6"),
        (options.gpus < 0, f"--gpus {options.gpus}: must be 0 or more", "e.g. --gpus 1"),
        (options.min_replicas < 0 or options.max_replicas < max(1, options.min_replicas),
         f"--min-replicas {options.min_replicas} / --max-replicas {options.max_replicas}: max must be >= min and >= 1",
         "e.g. --min-replicas 1 --max-replicas 3"),
        (not re.fullmatch(r"\d+(\.\d+)?m?", options.cpu), f"--cpu {options.cpu}: not a CPU quantity",
         "e.g. --cpu 2 or --cpu 500m"),
    ]
    for failed, message, hint in problems:
        if failed:
            raise InputError(message, hint=hint)


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
