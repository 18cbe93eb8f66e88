"""The candidate as KServe's canary: the InferenceService pinned to the candidate version, with
canaryTrafficPercent. Applied over the running spec (production's), KServe starts the candidate as a new
revision and sends it that share while the last ready revision (production) keeps the rest; the judge
reads both revisions' metrics through release.canary.sources.PrometheusSource.

Built on release.deploy.kserve (the pinned-version manifest, templates/kserve-inferenceservice.yaml), so
a canary manifest never drifts from the one `relctl render kserve` writes for a pinned version.
"""

from __future__ import annotations

from dataclasses import replace

import yaml

from release import __version__
from release.core.errors import InputError
from release.deploy.kserve import KServeOptions, render_kserve


def render_canary(model: str, candidate_version: str, production_version: str | None, percent: int,
                  options: KServeOptions, template: str | None = None) -> str:
    """YAML of the InferenceService that gives `candidate_version` `percent`% of the traffic."""
    if not 0 < percent <= 100:
        raise InputError(f"canary percent {percent}: must be within 1..100", hint="e.g. 10 for the first step")
    manifest = render_kserve(f"{model}/{candidate_version}", replace(options, canary_percent=percent), template)
    annotations = manifest["metadata"]["annotations"]
    annotations["relctl/canary"] = "true"
    annotations["relctl/candidate-version"] = candidate_version
    if production_version is not None:
        annotations["relctl/production-version"] = production_version
    header = (f"# relctl canary manifest: {model} v{candidate_version} at {percent}%"
              f"{f' beside production v{production_version}' if production_version else ''} "
              f"(relctl {__version__})\n")
    return header + str(yaml.safe_dump(manifest, sort_keys=False, width=120))
