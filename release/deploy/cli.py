"""`relctl render kserve MODEL/VERSION`: deployment manifests for a pinned version, on stdout or in a file;
`relctl publish` / `relctl pull`: a released package as an OCI artifact, pinned by digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import click

from release.commands.support import Ctx, emit, handled, json_option


@click.group("render")
def render_group() -> None:
    """Render deployment manifests for a pinned model version."""


def _node_selector(values: tuple[str, ...]) -> dict[str, str] | None:
    from release.core.errors import InputError

    selector: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--node-selector {item}: expected KEY=VALUE",
                             hint="e.g. --node-selector cloud.google.com/gke-accelerator=nvidia-h100-80gb")
        selector[key] = value
    return selector or None


@render_group.command("kserve")
@click.argument("spec", metavar="MODEL/VERSION")
@click.option("--image", required=True, help="relctl's image, built from templates/Dockerfile (or Dockerfile.cuda); "
                                             "for an engine that is its own server it fetches and verifies the "
                                             "package first.")
@click.option("--mode", type=click.Choice(["serverless", "raw"]), default="serverless", show_default=True,
              help="KServe deployment mode: serverless (Knative; --canary-percent splits traffic) or raw "
                   "(RawDeployment: a Deployment, rolled out with a surge; no traffic split).")
@click.option("--name", default=None, help="InferenceService name [default: the model name as a DNS label].")
@click.option("--namespace", default=None, help="Kubernetes namespace [default: none, kubectl's].")
@click.option("--secret", default="relctl-mlflow", show_default=True,
              help="Secret with MLFLOW_TRACKING_URI (and optional MLFLOW_TRACKING_TOKEN, AWS_* keys).")
@click.option("--canary-percent", type=click.IntRange(0, 100), default=None,
              help="Serverless mode: share of traffic for this revision while the previous one keeps the rest.")
@click.option("--cpu", default="1", show_default=True, help="CPU request, e.g. 2 or 500m.")
@click.option("--memory-gib", type=float, default=None,
              help="Memory request and limit per replica [default: the version's memory plan per replica plus "
                   "the serving process's own].")
@click.option("--gpus", type=click.IntRange(0), default=None,
              help="GPUs per replica [default: 1 for a version validated on CUDA, else 0].")
@click.option("--allow-unvalidated-device", is_flag=True,
              help="Render for a device the version was not validated on (annotated relctl/unvalidated-device) "
                   "[default: refused].")
@click.option("--gpu-resource", default="nvidia.com/gpu", show_default=True, help="Extended resource name of a GPU.")
@click.option("--node-selector", "node_selector", multiple=True, metavar="KEY=VALUE",
              help="Node labels the pods need (repeatable) [default on GPUs: nvidia.com/gpu.present=true].")
@click.option("--engine-image", default=None,
              help="An engine that is its own server: its image [default: the engine's own for the device, "
                   "where it has one].")
@click.option("--trusted-keys", default="relctl-trusted-keys", show_default=True,
              help="ConfigMap holding the release's public key (release.pub): relctl serve and the init "
                   "containers check the package's signature against it before anything loads.")
@click.option("--modelcar", is_flag=True,
              help="A version published with --base: KServe's ModelCar mounts its OCI digest (storageUri) and relctl "
                   "serve verifies those files [default: an init container pulls the digest and verifies it].")
@click.option("--cache-gib", type=float, default=10.0, show_default=True,
              help="Size of the writable package volume.")
@click.option("--min-replicas", type=click.IntRange(0), default=1, show_default=True, help="Fewest replicas.")
@click.option("--max-replicas", type=click.IntRange(1), default=1, show_default=True, help="Most replicas.")
@click.option("--startup-seconds", type=click.IntRange(10), default=600, show_default=True,
              help="Time to download, verify and load the package (the startup probe's budget) before liveness "
                   "checks start.")
@click.option("--template", "template_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Your copy of the template (relctl init writes deploy/kserve-inferenceservice.yaml) "
                                 "[default: relctl's own].")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="Output format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the manifest here instead of stdout.")
@click.option("--adapters", "with_adapters", is_flag=True,
              help="Serve the base version's production LoRA adapters too, each pinned by digest (docs/adapters.md); "
                   "an adapter's MODEL/VERSION renders its base with that adapter.")
@click.pass_obj
@handled
def kserve_command(ctx: Ctx, spec: str, image: str, mode: str, name: str | None, namespace: str | None, secret: str,
                   canary_percent: int | None, cpu: str, memory_gib: float | None, gpus: int | None,
                   gpu_resource: str, allow_unvalidated_device: bool, node_selector: tuple[str, ...],
                   engine_image: str | None, trusted_keys: str,
                   modelcar: bool, cache_gib: float, min_replicas: int, max_replicas: int, startup_seconds: int,
                   template_path: Path | None, fmt: str, output: Path | None, with_adapters: bool) -> None:
    """A KServe InferenceService serving MODEL/VERSION (a registered version: its backend decides from the
    package the device it was validated on, image, args and environment, its memory plan the memory, its OCI
    digest the source): a pinned version, so each new version is a new KServe revision. With --adapters (or
    an adapter's MODEL/VERSION), its LoRA adapters too, each pinned by source and package digest."""
    from release.core.outputs import check_output_file
    from release.deploy.facts import read_version_facts
    from release.deploy.kserve import (
        KServeOptions,
        Mode,
        check_options,
        parse_version_spec,
        render_kserve,
        render_kserve_yaml,
    )
    from release.deploy.pinning import pin_facts
    from release.registry.client import open_registry

    options = KServeOptions(image=image, name=name, namespace=namespace, secret=secret, mode=cast(Mode, mode),
                            canary_percent=canary_percent, cpu=cpu, memory_gib=memory_gib, gpus=gpus,
                            gpu_resource=gpu_resource, node_selector=_node_selector(node_selector),
                            engine_image=engine_image, allow_unvalidated_device=allow_unvalidated_device,
                            trusted_keys=trusted_keys, modelcar=modelcar,
                            cache_gib=cache_gib, min_replicas=min_replicas, max_replicas=max_replicas,
                            startup_seconds=startup_seconds)
    model, version = parse_version_spec(spec)
    check_options(options)   # before the registry is read: a bad option fails in milliseconds
    if output is not None:
        check_output_file(output, "-o")   # a missing folder is bad input found now, not after the render
    template = template_path.read_text() if template_path is not None else None
    registry = open_registry(ctx.project_dir, read_only=True)
    pins = None
    from release.deploy.kserve_adapters import base_of
    model, version, adapter = base_of(registry, model, version)  # an adapter version: its base, with it
    if with_adapters or adapter is not None:
        from release.deploy.kserve_adapters import adapter_pins
        from release.signing.keys import project_trust

        pins = adapter_pins(registry, model, version, adapter, project_trust(ctx.project_dir))
    # The OCI digest only as the version's signed publication record vouches for it (deploy/pinning.py).
    facts = pin_facts(registry, read_version_facts(registry, model, version), ctx.project_dir)
    text = (render_kserve_yaml(facts, options, template, pins) if fmt == "yaml"
            else json.dumps(render_kserve(facts, options, template, pins), indent=2) + "\n")
    if output is None:
        click.echo(text, nl=False)
    else:
        tmp = output.with_name(f".{output.name}.partial")
        tmp.write_text(text)
        tmp.replace(output)   # the manifest appears whole or not at all
        click.echo(f"wrote {output}", err=True)


@click.command("publish")
@click.argument("spec", metavar="MODEL/VERSION")
@click.option("--to", "target", required=True, metavar="oci://HOST/REPO[:TAG]",
              help="OCI repository to push to (plain HTTP only for 127.0.0.1/localhost).")
@click.option("--base", default=None, metavar="oci://HOST/REPO@sha256:DIGEST",
              help="Base image (one platform, with a shell, e.g. busybox) to layer the package on, so KServe's "
                   "ModelCar can run it (render kserve --modelcar).")
@json_option
@click.pass_obj
@handled
def publish_command(ctx: Ctx, spec: str, target: str, base: str | None, as_json: bool) -> None:
    """Push a released version's package, with its signature, as an OCI artifact (ModelCar layout: files
    under /models), and record its digest on the version (relctl.oci_digest) for `relctl render kserve`."""
    from release.deploy.oci import publish_version

    ctx.as_json = as_json
    data = publish_version(spec, target, ctx.project_dir, base)
    emit(data, as_json, lambda: click.echo(f"{data['model']} v{data['version']}: {data['uri']}"))


@click.command("pull")
@click.argument("source", metavar="oci://HOST/REPO@sha256:DIGEST|MODEL/VERSION")
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the verified package to (replaced whole; nothing is left on a failure).")
@click.option("--model", default=None, help="The model the package must be (checked against its manifest).")
@click.option("--version", "version", default=None,
              help="With --model: the version the digest must be, checked against its signed publication record "
                   "and the package against the version (the registry is read).")
@click.option("--sha256", "content_sha256", default=None, metavar="HEX",
              help="The package content digest the manifest pins (relctl.package_content_sha256): anything else "
                   "is refused.")
@json_option
@click.pass_obj
@handled
def pull_command(ctx: Ctx, source: str, dest: Path, model: str | None, version: str | None,
                 content_sha256: str | None, as_json: bool) -> None:
    """Fetch a package by OCI digest (or a registered version from the registry) and verify it: digest,
    manifest, signature against the trusted keys. What KServe init containers run before a server starts."""
    from release.deploy.oci import pull_package

    ctx.as_json = as_json
    data = pull_package(source, dest, ctx.project_dir, model, version, content_sha256)
    emit(data, as_json, lambda: click.echo(f"{source}: verified into {dest}"))
