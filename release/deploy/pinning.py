"""What a deployment manifest may name: exactly the version asked for, valid Kubernetes names, plain YAML.

- **The OCI digest is the version's own**: `relctl publish` records, beside `relctl.oci_digest`, a statement
  naming the model, the version, its release run, its manifest digest and the pinned OCI reference, signed
  with the release key (`relctl.oci_record` + `relctl.oci_record_signature`). `relctl render kserve` and
  `relctl pull --version` accept a digest only when that statement verifies with a trusted key and names the
  version asked for (its release run and manifest digest too): a digest tag copied from another version,
  edited to an unpinned reference (`oci://evil.example/x:latest`) or written by hand is refused, naming both.
- **Names**: every Kubernetes name the manifest carries (metadata.name, namespace, Secret and ConfigMap
  names) follows RFC 1123, and every image is a valid image reference (no space, newline or quote can reach
  the YAML); checked with the options, before the registry is read.
- **Plain YAML**: no anchors or aliases (`&id001` / `*id001`), so a reviewer reads every value where it applies.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from release.core.errors import InputError
from release.registry import Registry
from release.registry import tags as T
from release.registry.records import VersionRecord
from release.registry.versions import verify_version
from release.signing.approval import sign_approval, verify_approval
from release.signing.keys import SigningKey, Trust

RECORD_TYPE = "https://relctl.dev/oci-publication/v1"
# RFC 1123 label (namespaces, Service names) and subdomain (Secrets, ConfigMaps): what the API server accepts.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# The distribution reference grammar (docker/distribution reference.go): [host[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DNS = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"(?:{_DNS}(?:\.{_DNS})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_IMAGE = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@sha256:[0-9a-f]{{64}})?")
_LABEL_KEY = re.compile(r"(?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _shown(value: str) -> str:
    """The value as a message shows it: quoted (newlines escaped) when it holds a space or a control character."""
    return value if value.isprintable() and " " not in value and '"' not in value else json.dumps(value)


def check_k8s_name(value: str, what: str, *, subdomain: bool = False) -> None:
    """InputError (exit 2) unless `value` is an RFC 1123 label (or subdomain): lower case, digits, '-'."""
    limit = 253 if subdomain else 63
    pattern = _SUBDOMAIN if subdomain else _LABEL
    if not pattern.fullmatch(value) or len(value) > limit:
        shown = _shown(value)
        kind = "subdomain" if subdomain else "label"
        raise InputError(f"{what} {shown}: not a valid Kubernetes name (RFC 1123 {kind})",
                         hint=f"lower-case letters, digits and '-'{', and dots' if subdomain else ''}, starting and "
                              f"ending with a letter or digit, at most {limit} characters (e.g. prod-models)")


def check_image(value: str, what: str) -> None:
    """InputError unless `value` is an image reference as registries and kubelet parse it."""
    if not _IMAGE.fullmatch(value) or len(value) > 512:
        raise InputError(f"{what} {_shown(value)}: not a valid image reference",
                         hint="e.g. registry.example.com/team/relctl-serve:0.1.0 or ...@sha256:<64 hex>; no spaces, "
                              "upper-case repository names or line breaks")


def check_deploy_names(*, name: str | None, namespace: str | None, secret: str, config_map: str,
                       images: dict[str, str | None], node_selector: dict[str, str] | None,
                       gpu_resource: str) -> None:
    """Every name and image a KServe manifest will carry, before anything is read or written."""
    if name is not None:
        check_k8s_name(name, "--name")
    if namespace is not None:
        check_k8s_name(namespace, "--namespace")
    check_k8s_name(secret, "--secret", subdomain=True)
    check_k8s_name(config_map, "--trusted-keys", subdomain=True)
    for option, image in images.items():
        if image is not None:
            check_image(image, option)
    if not _LABEL_KEY.fullmatch(gpu_resource):
        raise InputError(f"--gpu-resource {_shown(gpu_resource)}: not a Kubernetes resource name",
                         hint="e.g. nvidia.com/gpu")
    for key, value in (node_selector or {}).items():
        if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
            raise InputError(f"--node-selector {_shown(f'{key}={value}')}: not a valid Kubernetes label",
                             hint="e.g. --node-selector nvidia.com/gpu.present=true")


class _PlainDumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML's stubs are not installed
    """yaml.SafeDumper that writes every value in place: a dict or list used twice is written twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def plain_yaml(document: Any) -> str:
    """YAML with no anchors or aliases, keys in their given order."""
    return str(yaml.dump(document, Dumper=_PlainDumper, sort_keys=False, width=120))


@dataclass(frozen=True)
class OciRecord:
    model: str
    version: str
    release_run: str | None
    manifest_sha256: str
    oci: str

    def statement(self) -> str:
        return json.dumps({"_type": RECORD_TYPE, "model": self.model, "version": self.version,
                           "release_run": self.release_run, "manifest_sha256": self.manifest_sha256,
                           "oci": self.oci}, sort_keys=True, separators=(",", ":"))


def record_publication(registry: Registry, mv: VersionRecord, uri: str, signer: SigningKey | None) -> None:
    """After `relctl publish`: the pinned reference on the version, with the signed record that binds it to
    this version (unsigned only under `signing: off`)."""
    record = OciRecord(mv.name, str(mv.version), mv.run_id or mv.tags.get(T.RELEASE_RUN),
                       mv.tags.get(T.MANIFEST_SHA256, ""), uri)
    statement = record.statement()
    registry.set_version_tags(mv.name, str(mv.version), {
        T.OCI_DIGEST: uri, T.OCI_RECORD: statement,
        T.OCI_RECORD_SIGNATURE: sign_approval(statement, signer) if signer is not None else ""})


def pinned_oci(mv: VersionRecord, trust: Trust) -> str | None:
    """The version's OCI reference, only as its signed publication record vouches for it; None when it was never
    published. InputError (exit 2) for anything else: a reference that is not pinned by digest, no record, a
    record that does not verify, or one that names another version, model, release run or manifest."""
    uri = mv.tags.get(T.OCI_DIGEST)
    if not uri:
        return None
    label = f"{mv.name} v{mv.version}"
    if not re.fullmatch(r"oci://[^\s@]+@sha256:[0-9a-f]{64}", uri):
        raise InputError(f"{label}: {T.OCI_DIGEST} is {json.dumps(uri)}, not a reference pinned by digest",
                         hint=f"re-publish it: relctl publish {mv.name}/{mv.version} --to oci://HOST/REPO")
    statement, signature = mv.tags.get(T.OCI_RECORD, ""), mv.tags.get(T.OCI_RECORD_SIGNATURE, "")
    if not statement:
        raise InputError(f"{label}: {T.OCI_DIGEST} {uri} has no publication record, so nothing says it is this "
                         "version's package", hint=f"re-publish it: relctl publish {mv.name}/{mv.version} --to ...")
    if not trust.off:
        if not signature:
            raise InputError(f"{label}: the publication record of {uri} is not signed",
                             hint=f"re-publish it with the release key: relctl publish {mv.name}/{mv.version} --to ...")
        verify_approval(statement, signature, trust)  # InputError naming an untrusted signer or an altered record
    try:
        data = json.loads(statement)
    except ValueError:
        data = {}
    wanted = {"model": mv.name, "version": str(mv.version), "oci": uri,
              "manifest_sha256": mv.tags.get(T.MANIFEST_SHA256),
              "release_run": mv.run_id or mv.tags.get(T.RELEASE_RUN)}
    wrong = [key for key, value in wanted.items() if data.get(key) != value]
    if data.get("_type") != RECORD_TYPE or wrong:
        recorded = f"{data.get('model')} v{data.get('version')} ({data.get('oci')})"
        raise InputError(f"{label}: {T.OCI_DIGEST} {uri} is vouched for as {recorded}, not as {label} "
                         f"({', '.join(wrong) or 'record type'} differ)",
                         hint=f"render the version that was published, or re-publish {mv.name}/{mv.version}")
    return uri


def check_pulled(registry: Registry, model: str, version: str, source: str, root: Path, trust: Trust) -> Any:
    """`relctl pull oci://...@sha256:D --model M --version V`: D must be the digest V's signed publication
    record names, and the pulled package must verify as V (files, signature, binding). The Verdict."""
    mv = registry.get_version(model, version)
    pinned = pinned_oci(mv, trust)
    if pinned != source:
        raise InputError(f"{source}: not the digest {model} v{version} was published as "
                         f"({pinned or 'it was never published'})",
                         hint=f"pull {pinned or model + '/' + version}")
    return verify_version(registry, root, mv, trust)[1]


def pin_facts(registry: Registry, facts: Any, project_dir: Path) -> Any:
    """`facts` (deploy.facts.VersionFacts) with its OCI reference as pinned_oci vouches for it."""
    import dataclasses  # noqa: PLC0415

    from release.signing.keys import project_trust  # noqa: PLC0415

    mv = registry.get_version(facts.model, facts.version)
    return dataclasses.replace(facts, oci_uri=pinned_oci(mv, project_trust(project_dir)))


def check_kserve_options(options: Any) -> None:
    """deploy.kserve.KServeOptions' names and images (check_deploy_names)."""
    check_deploy_names(name=options.name, namespace=options.namespace, secret=options.secret,
                       config_map=options.trusted_keys, images={"--image": options.image,
                                                                "--engine-image": options.engine_image},
                       node_selector=options.node_selector, gpu_resource=options.gpu_resource)
