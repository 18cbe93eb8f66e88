"""A Kubernetes indexed Job that runs one bench plan as N segments (templates/k8s-bench-job.yaml)."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from release.core.errors import InputError

TEMPLATE = "k8s-bench-job.yaml"
RESULTS = "/results"


def template_path() -> Path:
    """templates/k8s-bench-job.yaml as shipped in the package (release/templates is templates/)."""
    return Path(str(files("release").joinpath("templates", TEMPLATE)))


def render_bench_job(bench_args: list[str], segments: int, start_at: float, *, name: str = "relctl-bench",
                     image: str = "relctl:latest", namespace: str | None = None,
                     results_claim: str = "relctl-bench-results", template: Path | None = None) -> str:
    """The Job as YAML: `segments` pods at once, pod i running
    `relctl bench <bench_args> --segment i/N --start-at START --out /results/segment-i`.

    `bench_args`: the URL and traffic options exactly as for a local run (no --segment/--start-at/--out).
    """
    if segments < 1:
        raise InputError(f"--segments {segments}: must be at least 1", hint="e.g. --segments 4")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?", name):
        raise InputError(f"--job-name {name}: not a Kubernetes name",
                         hint="lowercase letters, digits and '-', e.g. relctl-bench")
    taken = {"--segment", "--start-at", "--out", "--render-job", "--segments"} & {a.split("=")[0] for a in bench_args}
    if taken:
        raise InputError(f"bench job: {', '.join(sorted(taken))} is set per pod by the Job",
                         hint="pass the URL and traffic options only")
    path = template or template_path()
    try:
        job: dict[str, Any] = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read the bench Job template ({exc.__class__.__name__})",
                         hint="reinstall relctl; its wheel ships templates/ as package data") from exc
    job["metadata"]["name"] = name
    if namespace:
        job["metadata"]["namespace"] = namespace
    spec = job["spec"]
    spec["completions"] = spec["parallelism"] = segments
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    container["image"] = image
    container["args"] = [*bench_args, "--segment", f"$(JOB_COMPLETION_INDEX)/{segments}",
                         "--start-at", f"{start_at:.3f}", "--out", f"{RESULTS}/segment-$(JOB_COMPLETION_INDEX)"]
    for volume in pod.get("volumes", []):
        if volume.get("name") == "results" and "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = results_claim
    job["metadata"].setdefault("annotations", {})["relctl/bench-start-at"] = f"{start_at:.3f}"
    header = (f"# relctl bench as an indexed Job: {segments} segments of one plan, starting at Unix time "
              f"{start_at:.3f}\n# merge: relctl bench merge {RESULTS}/segment-*\n")
    return header + str(yaml.safe_dump(job, sort_keys=False))
