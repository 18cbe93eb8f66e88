"""`relctl render kserve` renders exactly the version asked for (issue 31): its OCI digest only as the version's
signed publication record vouches for it; every Kubernetes name and image checked; plain YAML.

Real MLflow (SQLite), real signed packages, real keys; the publication records are written by the function
`relctl publish` calls after a push (release/deploy/pinning.py), so no OCI registry is needed here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from release.cli import cli
from release.deploy.pinning import record_publication
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.signing.keys import project_signing_key
from tests.deploy.conftest import genai_package

IMAGE = "registry.example.com/relctl-serve:0.1.0"
DIGEST = {"1": "sha256:" + "1" * 64, "2": "sha256:" + "2" * 64}


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.fixture()
def published(project_dir: Path, tmp_path: Path) -> Path:
    """tiny-llm v1 and v2 (CPU builds, signed with the session's release key), each published: v2 first,
    then v1 (v1 is the one published last)."""
    for n in ("1", "2"):
        done = relctl(project_dir, "register", str(genai_package(tmp_path, f"v{n}", "cpu")), "--model", "tiny-llm")
        assert done.exit_code == 0, done.output
    registry = Registry(resolve_store(project_dir))
    signer = project_signing_key(project_dir)
    for n in ("2", "1"):
        record_publication(registry, registry.get_version("tiny-llm", n),
                           f"oci://127.0.0.1:5000/models/tiny-llm@{DIGEST[n]}", signer)
    return project_dir


def render(project: Path, spec: str, *extra: str) -> Result:
    return relctl(project, "render", "kserve", spec, "--image", IMAGE, "--memory-gib", "2", *extra)


def test_each_version_renders_its_own_digest_and_the_pull_checks_it_against_that_version(published: Path) -> None:
    for n in ("1", "2"):
        result = render(published, f"tiny-llm/{n}")
        assert result.exit_code == 0, result.output
        manifest = yaml.safe_load(result.stdout)
        pull = manifest["spec"]["predictor"]["initContainers"][0]["command"]
        assert pull[pull.index("pull") + 1] == f"oci://127.0.0.1:5000/models/tiny-llm@{DIGEST[n]}"
        assert pull[pull.index("--version") + 1] == n and pull[pull.index("--model") + 1] == "tiny-llm"
        assert manifest["spec"]["predictor"]["containers"][0]["args"] == [f"tiny-llm/{n}"]


def test_v2_is_refused_when_its_digest_tags_name_the_version_published_last(published: Path) -> None:
    registry = Registry(resolve_store(published))
    v1 = registry.get_version("tiny-llm", "1").tags
    registry.set_version_tags("tiny-llm", "2", {k: v1[k] for k in (T.OCI_DIGEST, T.OCI_RECORD, T.OCI_RECORD_SIGNATURE)})
    result = render(published, "tiny-llm/2")
    assert result.exit_code == 2 and result.stdout == ""
    line = result.stderr.splitlines()[0]
    assert line.startswith(f"error: tiny-llm v2: relctl.oci_digest oci://127.0.0.1:5000/models/tiny-llm@{DIGEST['1']} "
                           "is vouched for as tiny-llm v1")


@pytest.mark.parametrize(("tags", "message"), [
    ({T.OCI_DIGEST: "oci://evil.example/x:latest"}, 'relctl.oci_digest is "oci://evil.example/x:latest", not a '
                                                    "reference pinned by digest"),
    ({T.OCI_DIGEST: f"oci://evil.example/x@{DIGEST['2']}"}, "is vouched for as tiny-llm v2"),
    ({T.OCI_RECORD_SIGNATURE: ""}, "is not signed"),
    ({T.OCI_RECORD: ""}, "has no publication record"),
])
def test_a_digest_tag_edited_by_hand_is_refused(published: Path, tags: dict[str, str], message: str) -> None:
    Registry(resolve_store(published)).set_version_tags("tiny-llm", "2", tags)
    result = render(published, "tiny-llm/2")
    assert result.exit_code == 2, result.output
    assert message in result.stderr.splitlines()[0]


def test_a_record_altered_after_it_was_signed_is_refused(published: Path) -> None:
    registry = Registry(resolve_store(published))
    record = json.loads(registry.get_version("tiny-llm", "2").tags[T.OCI_RECORD])
    record["oci"] = f"oci://evil.example/x@{DIGEST['1']}"
    registry.set_version_tags("tiny-llm", "2", {T.OCI_RECORD: json.dumps(record, sort_keys=True,
                                                                         separators=(",", ":")),
                                                T.OCI_DIGEST: record["oci"]})
    result = render(published, "tiny-llm/2")
    assert result.exit_code == 2
    assert "does not verify with trusted key" in result.stderr.splitlines()[0]


@pytest.mark.parametrize(("args", "message"), [
    (("--namespace", "Prod Models"), 'error: --namespace "Prod Models": not a valid Kubernetes name'),
    (("--image", "registry.example.com/relctl serve:1"), 'error: --image "registry.example.com/relctl serve:1": '
                                                          "not a valid image reference"),
    (("--image", "relctl\nkind: Secret"), 'error: --image "relctl\\nkind: Secret": not a valid image reference'),
    (("--engine-image", "vllm/vllm openai"), 'error: --engine-image "vllm/vllm openai": not a valid image reference'),
    (("--secret", "mlflow creds"), 'error: --secret "mlflow creds": not a valid Kubernetes name'),
    (("--trusted-keys", "Keys!"), "error: --trusted-keys Keys!: not a valid Kubernetes name"),
    (("--name", "-x"), "error: --name -x: not a valid Kubernetes name"),
    (("--node-selector", "pool=gpu nodes"), 'error: --node-selector "pool=gpu nodes": not a valid Kubernetes label'),
])
def test_hostile_names_are_refused_before_the_registry_is_read(tmp_path: Path, args: tuple[str, ...],
                                                               message: str) -> None:
    # tmp_path holds no registry at all: the options fail first.
    result = relctl(tmp_path, "render", "kserve", "tiny-llm/1", "--image", IMAGE, "--memory-gib", "2", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == message or lines[0].startswith(message), lines
    assert len(lines) == 2 and lines[1].startswith("hint: ") and result.stdout == ""


def test_the_manifest_is_plain_yaml_without_anchors_or_aliases(published: Path) -> None:
    result = render(published, "tiny-llm/1", "--mode", "raw")
    assert result.exit_code == 0, result.output
    assert "&id" not in result.stdout and "*id" not in result.stdout
    events = [type(e).__name__ for e in yaml.parse(result.stdout)]
    assert "AliasEvent" not in events
    manifest = yaml.safe_load(result.stdout)
    init = manifest["spec"]["predictor"]["initContainers"][0]
    assert init["volumeMounts"] == manifest["spec"]["predictor"]["containers"][0]["volumeMounts"]
