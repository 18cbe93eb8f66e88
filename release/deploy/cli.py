"""`relctl render kserve MODEL/VERSION`: deployment manifests for a pinned version, on stdout or in a file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from release.commands.support import Ctx, handled


@click.group("render")
def render_group() -> None:
    """Render deployment manifests for a pinned model version."""


@render_group.command("kserve")
@click.argument("spec", metavar="MODEL/VERSION")
@click.option("--image", required=True, help="Image built from templates/Dockerfile (or Dockerfile.cuda).")
@click.option("--name", default=None, help="InferenceService name [default: the model name as a DNS label].")
@click.option("--namespace", default=None, help="Kubernetes namespace [default: none, kubectl's].")
@click.option("--secret", default="relctl-mlflow", show_default=True,
              help="Secret with MLFLOW_TRACKING_URI (and optional MLFLOW_TRACKING_TOKEN, AWS_* keys).")
@click.option("--canary-percent", type=click.IntRange(0, 100), default=None,
              help="Share of traffic for this revision while the previous one keeps the rest.")
@click.option("--cpu", default="1", show_default=True, help="CPU request, e.g. 2 or 500m.")
@click.option("--memory-gib", type=float, default=4.0, show_default=True,
              help="Memory request and limit per replica: the memory plan's per-replica figure.")
@click.option("--gpus", type=click.IntRange(0), default=0, show_default=True, help="GPUs per replica.")
@click.option("--gpu-resource", default="nvidia.com/gpu", show_default=True, help="Extended resource name of a GPU.")
@click.option("--cache-gib", type=float, default=10.0, show_default=True,
              help="Size of the writable package cache volume.")
@click.option("--min-replicas", type=click.IntRange(0), default=1, show_default=True, help="Fewest replicas.")
@click.option("--max-replicas", type=click.IntRange(1), default=1, show_default=True, help="Most replicas.")
@click.option("--startup-seconds", type=click.IntRange(0), default=300, show_default=True,
              help="Time to download and load the package before liveness checks start.")
@click.option("--template", "template_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Your copy of the template (relctl init writes deploy/kserve-inferenceservice.yaml) "
                                 "[default: relctl's own].")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="Output format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the manifest here instead of stdout.")
@click.pass_obj
@handled
def kserve_command(ctx: Ctx, spec: str, image: str, name: str | None, namespace: str | None, secret: str,
                   canary_percent: int | None, cpu: str, memory_gib: float, gpus: int, gpu_resource: str,
                   cache_gib: float, min_replicas: int, max_replicas: int, startup_seconds: int,
                   template_path: Path | None, fmt: str, output: Path | None) -> None:
    """A KServe InferenceService serving MODEL/VERSION with `relctl serve`: a pinned version, so each
    new version is a new KServe revision and --canary-percent splits traffic between them."""
    from release.deploy.kserve import KServeOptions, render_kserve, render_kserve_yaml

    options = KServeOptions(image=image, name=name, namespace=namespace, secret=secret,
                            canary_percent=canary_percent, cpu=cpu, memory_gib=memory_gib, gpus=gpus,
                            gpu_resource=gpu_resource, cache_gib=cache_gib, min_replicas=min_replicas,
                            max_replicas=max_replicas, startup_seconds=startup_seconds)
    template = template_path.read_text() if template_path is not None else None
    text = (render_kserve_yaml(spec, options, template) if fmt == "yaml"
            else json.dumps(render_kserve(spec, options, template), indent=2) + "\n")
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"wrote {output}", err=True)
