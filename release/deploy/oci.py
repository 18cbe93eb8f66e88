"""A released package as an OCI artifact, pinned by digest: `relctl publish` pushes it, `relctl pull` fetches
and verifies it (what a KServe init container runs before a server starts).

The artifact is an OCI image in KServe's ModelCar layout: one gzip'd tar layer whose files are under
`/models` (the package folder: model/, source/, relctl-package.json and its signature and provenance), and
an image config naming that layer, so registries, `oras` and container tooling take it as an image. The tar
is deterministic (sorted names, mtime 0, root-owned, 0644): republishing the same package gives the same
digest. The push goes through oras-py (PyPI `oras`, OCI distribution spec, registry token auth from the
Docker config); the manifest bytes are relctl's own, so the digest recorded on the version
(`relctl.oci_digest`, as `oci://HOST/REPO@sha256:...`) is known before the registry answers, and checked
against the digest the registry reports.

A pull is by digest only (a tag can be moved): the manifest's sha256 must be the pinned digest, each blob's
sha256 its descriptor's, the tar may hold only plain files and folders under models/, and the package must
then pass `verify_package` and its signature check against the trusted keys. Plain HTTP is used for a
registry on the loopback address only (a test or a port-forward); anything else is HTTPS.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release import __version__
from release.core.errors import InputError, RegistryError
from release.core.hashing import sha256_file
from release.core.jsonfile import parse_json
from release.core.package import MANIFEST, verify_package
from release.registry.versions import fetch_package, fetch_verified

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"   # the same bytes, Docker's name
DOCKER_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
TITLE = "org.opencontainers.image.title"
# The layer's tar size, pinned with the manifest's digest: a pull stops decompressing past it (a gzip layer can
# expand ~1000-fold). A layer without it (pushed by another tool) is bounded by RELCTL_OCI_MAX_UNPACKED_BYTES.
UNPACKED = "dev.relctl.layer.unpacked-size"
MAX_UNPACKED_BYTES = 256 * 1024**3
MODELS_DIR = "models"     # KServe's ModelCar reads the model from /models of the image
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
MAX_CONFIG_BYTES = 4 * 1024 * 1024   # an image config is a few KB; its descriptor's size bounds the read below this
_REFERENCE = re.compile(r"^oci://(?P<host>[A-Za-z0-9.-]+(?::\d+)?|\[::1\](?::\d+)?)/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
                        r"(?:(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))|(?:@(?P<digest>sha256:[0-9a-f]{64})))?$")


@dataclass(frozen=True)
class OciRef:
    host: str
    repo: str
    tag: str | None = None
    digest: str | None = None

    @property
    def pinned(self) -> str:
        return f"oci://{self.host}/{self.repo}@{self.digest}"


def parse_oci(uri: str) -> OciRef:
    """oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]; InputError naming the form otherwise."""
    match = _REFERENCE.match(uri)
    if not match:
        raise InputError(f"{uri}: not an OCI reference", hint="e.g. oci://registry.example.com/models/tiny-llm or "
                                                              "oci://HOST/REPO@sha256:<64 hex>")
    return OciRef(match["host"], match["repo"], match["tag"], match["digest"])


def _insecure(ref: OciRef) -> bool:
    host = ref.host.rsplit(":", 1)[0] if not ref.host.startswith("[") else ref.host.split("]")[0] + "]"
    return host in LOOPBACK


def _client(ref: OciRef) -> Any:
    """An oras client for the registry, once it answered: oras retries a refused connection for over two
    minutes (right for a blip, not for a wrong host), so one plain request first fails fast, exit 4."""
    import httpx  # noqa: PLC0415

    from release.deploy.oci_http import BoundedRegistry  # noqa: PLC0415 - only publish and pull need oras

    base = f"{'http' if _insecure(ref) else 'https'}://{ref.host}/v2/"
    try:
        httpx.get(base, timeout=10)   # 200, or 401 asking for a token: either way a registry is there
    except httpx.HTTPError as exc:
        raise RegistryError(f"cannot reach the OCI registry {ref.host}: {exc}",
                            hint="check the host and port, and that the registry is up") from exc
    return BoundedRegistry(ref.host, _insecure(ref))


def _container(client: Any, ref: OciRef) -> Any:
    container = client.get_container(f"{ref.host}/{ref.repo}")
    client.auth.load_configs(container)   # credentials from the Docker config, when it has some
    return container


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_bytes(package: Path) -> tuple[bytes, str, int]:
    """(gzip'd tar, diff id: sha256 of the tar, the tar's size) of `package` under models/, the same bytes for
    the same files."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = sorted(p for p in package.rglob("*"))
        for path in [package, *entries]:
            rel = path.relative_to(package).as_posix()
            name = MODELS_DIR if rel == "." else f"{MODELS_DIR}/{rel}"
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = path.stat().st_size, 0o644
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
    tar_data = raw.getvalue()
    return gzip.compress(tar_data, mtime=0), _sha256(tar_data), len(tar_data)


@dataclass(frozen=True)
class BaseImage:
    """A base image (with a shell: KServe's ModelCar sidecar runs `sh` from the image) the package is layered on."""

    uri: str
    layers: list[dict[str, Any]]
    config: dict[str, Any]


def _pinned_manifest(client: Any, container: Any, ref: OciRef, uri: str, accept: str, label: str,
                     hint: str) -> dict[str, Any]:
    """The manifest at `ref`'s digest (read up to the manifest cap), checked to hash to that digest and to be
    a JSON object (InputError `label: ...` otherwise)."""
    from release.deploy.oci_http import max_manifest_bytes  # noqa: PLC0415

    content = client.read_bounded(f"{client.prefix}://{container.manifest_url(ref.digest)}",
                                  f"the manifest of {uri}", max_manifest_bytes(), accept)
    if _sha256(content) != ref.digest:
        raise InputError(f"{label}: the registry answered a manifest whose sha256 is not the pinned digest", hint=hint)
    manifest = parse_json(content, f"{label}: its manifest", hint)
    if not isinstance(manifest, dict):
        raise InputError(f"{label}: its manifest is not a JSON object", hint=hint)
    return manifest


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _descriptor(value: Any, label: str) -> dict[str, Any]:
    """An OCI descriptor with a sha256 digest and a size: what every read of a blob is bounded by."""
    hint = "pull an artifact `relctl publish` pushed"
    if not isinstance(value, dict) or not _DIGEST.fullmatch(str(value.get("digest"))):
        raise InputError(f"{label}: a descriptor without a sha256 digest", hint=hint)
    size = value.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InputError(f"{label}: descriptor {value['digest']} has no size", hint=hint)
    return value


def read_base(uri: str) -> BaseImage:
    """The image manifest and config of `uri` (pinned by digest, one platform), every digest checked."""
    ref = parse_oci(uri)
    if not ref.digest:
        raise InputError(f"--base {uri}: not pinned by digest",
                         hint="pass oci://HOST/REPO@sha256:... of the base image")
    client = _client(ref)
    try:
        container = _container(client, ref)
        manifest = _pinned_manifest(client, container, ref, uri,
                                    ", ".join((MANIFEST_TYPE, DOCKER_MANIFEST_TYPE, *INDEX_TYPES)),
                                    f"--base {uri}", "the registry is serving other bytes for that digest")
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            raise InputError(f"--base {uri}: an index of platforms, not one image",
                             hint="pin the linux/amd64 image's own digest (crane digest --platform linux/amd64 IMAGE)")
        config = _descriptor(manifest.get("config"), f"--base {uri}: config")
        config_digest = config["digest"]
        raw_layers = manifest.get("layers", [])
        if not isinstance(raw_layers, list):
            raise InputError(f"--base {uri}: its manifest's layers are not a list", hint="do not build on it")
        found = [_descriptor(d, f"--base {uri}: layer") for d in raw_layers]
        blob = client.read_bounded(f"{client.prefix}://{container.get_blob_url(config_digest)}",
                                   f"the config of {uri}", min(config["size"], MAX_CONFIG_BYTES))
    except (OSError, ValueError) as exc:
        raise RegistryError(f"cannot read the base image {uri}: {exc}", hint="check the registry is up") from exc
    if _sha256(blob) != config_digest:
        raise InputError(f"--base {uri}: its config does not match its digest", hint="do not build on it")
    layers = [dict(d, mediaType=LAYER_TYPE if d.get("mediaType") == DOCKER_LAYER_TYPE else d.get("mediaType"))
              for d in found]
    image_config = parse_json(blob, f"--base {uri}: its config", "do not build on it")
    if not isinstance(image_config, dict):
        raise InputError(f"--base {uri}: its config is not a JSON object", hint="do not build on it")
    return BaseImage(uri, layers, image_config)


def _copy_base_layers(base: BaseImage, client: Any, container: Any, tmp: Path) -> None:
    """The base image's layers into the target repository (each checked against its digest on the way)."""
    source = parse_oci(base.uri)
    from release.deploy.oci_http import min_rate  # noqa: PLC0415

    source_client = _client(source)
    source_container = _container(source_client, source)
    for layer in base.layers:
        if client.blob_exists(layer, container):
            continue
        path = tmp / "base-layer"
        source_client.download_bounded(f"{source_client.prefix}://{source_container.get_blob_url(layer['digest'])}",
                                       f"--base {base.uri}: layer {layer['digest']}", layer["size"], layer["digest"],
                                       path)
        what = f"copy of the base layer {layer['digest']}"
        with client.operation(what, extra_s=layer["size"] / min_rate()):
            _check(client.upload_blob(str(path), container, layer), what, client.hostname)


def publish_package(package: Path, target: str, annotations: dict[str, str], base: BaseImage | None = None) -> str:
    """Push the verified package folder to `target` (oci://HOST/REPO[:TAG]), on `base`'s layers when given; the
    pinned oci://...@sha256 URI."""
    ref = parse_oci(target)
    if ref.digest:
        raise InputError(f"{target}: a digest names what was pushed, it cannot be pushed to",
                         hint="pass oci://HOST/REPO or oci://HOST/REPO:TAG")
    layer, diff_id, unpacked = layer_bytes(package)
    image_config: dict[str, Any] = dict(base.config) if base else {"architecture": "amd64", "os": "linux"}
    rootfs = dict(image_config.get("rootfs") or {"type": "layers", "diff_ids": []})
    rootfs["diff_ids"] = [*rootfs.get("diff_ids", []), diff_id]
    runtime = dict(image_config.get("config") or {})
    runtime["Labels"] = {**(runtime.get("Labels") or {}), **annotations}
    history = [*image_config.get("history", []), {"created_by": f"relctl publish (relctl {__version__})",
                                                  "comment": "the release's package under /models"}]
    config = json.dumps({**image_config, "rootfs": rootfs, "config": runtime, "history": history},
                        sort_keys=True).encode()
    ours = {"mediaType": LAYER_TYPE, "digest": _sha256(layer), "size": len(layer), "annotations": {TITLE: MODELS_DIR,
                                                                            UNPACKED: str(unpacked)}}
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": _sha256(config), "size": len(config)},
        "layers": [*(base.layers if base else []), ours],
        "annotations": annotations,
    }, sort_keys=True).encode()
    digest = _sha256(manifest)
    from release.deploy.oci_http import min_rate  # noqa: PLC0415

    client = _client(ref)
    try:
        container = _container(client, ref)
        with tempfile.TemporaryDirectory(prefix="relctl-oci-") as tmp:
            if base:
                _copy_base_layers(base, client, container, Path(tmp))
            for data, media_type in ((config, CONFIG_TYPE), (layer, LAYER_TYPE)):
                blob = Path(tmp) / "blob"
                blob.write_bytes(data)
                what = f"upload of a {len(data)}-byte blob to {target}"
                with client.operation(what, extra_s=len(data) / min_rate()):
                    response = client.upload_blob(str(blob), container,
                                                  {"mediaType": media_type, "digest": _sha256(data), "size": len(data)})
                    _check(response, what, client.hostname)
        url = f"{client.prefix}://{container.manifest_url(ref.tag or digest)}"
        with client.operation(f"push of the manifest to {target}"):
            response = client.do_request(url, "PUT", data=manifest, headers={"Content-Type": MANIFEST_TYPE})
            _check(response, f"push of the manifest to {target}", client.hostname)
    except ValueError as exc:   # oras raises ValueError when it cannot authenticate or gets no upload URL
        raise RegistryError(f"cannot push to {target}: {exc}",
                            hint="check that you may push to it (docker login)") from exc
    except OSError as exc:
        raise RegistryError(f"cannot push to {target}: {exc}", hint="check the registry is up") from exc
    answered = response.headers.get("Docker-Content-Digest")
    if answered and answered != digest:
        raise RegistryError(f"{target}: the registry stored the manifest as {answered}, not {digest}",
                            hint="the registry rewrote the manifest; use one that stores OCI manifests as pushed")
    return OciRef(ref.host, ref.repo, digest=digest).pinned


def pull_artifact(uri: str, dest: Path) -> Path:
    """Download oci://HOST/REPO@sha256:... into `dest` (a new folder), every digest checked; the package folder."""
    ref = parse_oci(uri)
    if not ref.digest:
        raise InputError(f"{uri}: not pinned by digest (a tag can be moved to other bytes)",
                         hint="pass oci://HOST/REPO@sha256:...; `relctl publish` prints it")
    client = _client(ref)
    try:
        container = _container(client, ref)
        manifest = _pinned_manifest(client, container, ref, uri, MANIFEST_TYPE, uri,
                                    "the registry is serving other bytes than were published; do not deploy them")
        # The package's layer: the one named models (a base image's layers below it are not the package).
        raw_layers = manifest.get("layers", [])
        layers = [d for d in (raw_layers if isinstance(raw_layers, list) else []) if isinstance(d, dict)
                  and d.get("mediaType") == LAYER_TYPE and isinstance(d.get("annotations") or {}, dict)
                  and (d.get("annotations") or {}).get(TITLE) == MODELS_DIR]
        if len(layers) != 1:
            raise InputError(f"{uri}: not a relctl package artifact (expected one {LAYER_TYPE} layer titled "
                             f"{MODELS_DIR})",
                             hint="pull an artifact `relctl publish` pushed")
        layer = _descriptor(layers[0], f"{uri}: layer")
        blob = dest.parent / f".{dest.name}.layer"
        try:   # exactly the descriptor's size, hashing to its digest: more is refused unread
            client.download_bounded(f"{client.prefix}://{container.get_blob_url(layer['digest'])}",
                                    f"{uri}: its layer", layer["size"], layer["digest"], blob)
            _extract(blob, dest, uri, unpacked_limit(layer, uri))
        finally:
            blob.unlink(missing_ok=True)
    except (OSError, ValueError) as exc:
        raise RegistryError(f"cannot pull {uri}: {exc}", hint="check the registry is up and reachable") from exc
    return dest / MODELS_DIR


def unpacked_limit(layer: dict[str, Any], uri: str) -> int:
    """How many bytes the layer may decompress to: its pinned UNPACKED annotation, else the documented default."""
    declared = (layer.get("annotations") or {}).get(UNPACKED)
    if declared is None:
        raw = os.environ.get("RELCTL_OCI_MAX_UNPACKED_BYTES")
        if raw is not None and not (raw.isdigit() and 0 < int(raw) < 2**63):
            raise InputError(f"RELCTL_OCI_MAX_UNPACKED_BYTES={raw}: not a positive whole number of bytes",
                             hint=f"unset it for the default ({MAX_UNPACKED_BYTES})")
        return int(raw) if raw is not None else MAX_UNPACKED_BYTES
    if not (isinstance(declared, str) and declared.isdigit() and int(declared) < 2**63):
        raise InputError(f"{uri}: its layer's {UNPACKED} annotation is not a size in bytes",
                         hint="pull an artifact `relctl publish` pushed")
    return int(declared)


class _UnpackedTooLarge(Exception):
    pass


class _CappedGzip:
    """The decompressed stream of a gzip file, refusing to go past `cap` bytes (reads and forward seeks alike):
    what tarfile reads a layer through."""

    def __init__(self, path: Path, cap: int) -> None:
        self.stream = gzip.GzipFile(filename=str(path), mode="rb")
        self.cap = cap

    def read(self, size: int = -1) -> bytes:
        left = self.cap + 1 - self.stream.tell()
        data = self.stream.read(left if size < 0 else min(size, max(left, 0)))
        if self.stream.tell() > self.cap:
            raise _UnpackedTooLarge
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self.stream.tell() + offset if whence == 1 else self.cap + 1
        if target > self.cap:
            raise _UnpackedTooLarge
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> _CappedGzip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _extract(blob: Path, dest: Path, uri: str, limit: int) -> None:
    """Plain files and folders under models/ only: no links, devices, absolute paths or `..`; at most `limit`
    bytes decompressed. A layer that is not a gzip'd tar, is cut short or expands past its pinned size is bad
    input (exit 2), not a relctl bug."""
    try:
        with _CappedGzip(blob, limit) as stream, tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if (member.name.startswith("/") or ".." in parts or not parts or parts[0] != MODELS_DIR
                        or not (member.isfile() or member.isdir())):
                    raise InputError(f"{uri}: the layer holds '{member.name}', which a package never does",
                                     hint="pull an artifact `relctl publish` pushed")
            tar.extractall(dest, filter="data")
    except _UnpackedTooLarge as exc:
        raise InputError(f"{uri}: its layer expands past {limit} bytes (the size pinned for it)",
                         hint="the registry is serving other bytes than were published; do not deploy them") from exc
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(f"{uri}: its layer is not a complete gzip'd tar ({type(exc).__name__}: {exc})",
                         hint="pull an artifact `relctl publish` pushed") from exc


def publish_version(spec: str, target: str, project_dir: Path, base: str | None = None) -> dict[str, str]:
    """`relctl publish MODEL/VERSION --to oci://...`: the version's package, fetched and verified (digest
    recorded at release, signature), pushed, and its pinned URI recorded on the version."""
    from release.deploy.kserve import parse_version_spec  # noqa: PLC0415
    from release.deploy.pinning import record_publication  # noqa: PLC0415
    from release.registry import tags as T  # noqa: PLC0415
    from release.registry.client import open_registry  # noqa: PLC0415
    from release.signing.keys import project_signing_key, project_trust  # noqa: PLC0415

    model, version = parse_version_spec(spec)
    ref = parse_oci(target)   # a bad target fails before anything is downloaded
    if ref.digest:
        raise InputError(f"{target}: a digest names what was pushed, it cannot be pushed to",
                         hint="pass oci://HOST/REPO or oci://HOST/REPO:TAG")
    trust = project_trust(project_dir)
    signer = project_signing_key(project_dir)  # signs the publication record; a missing key fails before the push
    registry = open_registry(project_dir, read_only=True)
    mv = registry.get_version(model, version)
    base_image = read_base(base) if base else None
    tag = ref.tag or f"v{version}"
    with tempfile.TemporaryDirectory(prefix="relctl-publish-") as tmp:
        package = fetch_package(registry, model, version, Path(tmp), mv, trust=trust)
        annotations = {"org.opencontainers.image.title": f"{model} v{version}",
                       "org.opencontainers.image.version": version,
                       "relctl.model": model, "relctl.version": version,
                       T.MANIFEST_SHA256: sha256_file(package.root / MANIFEST),
                       "relctl.published-by": f"relctl {__version__}"}
        if base:
            annotations["org.opencontainers.image.base.name"] = base
        uri = publish_package(package.root, f"oci://{ref.host}/{ref.repo}:{tag}", annotations, base_image)
    record_publication(registry, mv, uri, signer)  # the digest, bound to this version by a signed record
    return {"model": model, "version": version, "uri": uri, "tag": f"oci://{ref.host}/{ref.repo}:{tag}"}


def pulled_before(folder: Path) -> bool:
    """A folder `relctl pull` wrote: a package manifest and exactly the files it lists (plus the signature and
    provenance). Only such a folder is replaced (an init container's cache on a restarted pod); anything else
    that is not empty is refused, so a pull never deletes what a user keeps there."""
    from release.core.package import UNLISTED, load_manifest_data  # noqa: PLC0415

    if not (folder / MANIFEST).is_file():
        return False
    try:
        listed = set(load_manifest_data(folder / MANIFEST)["files"])
    except InputError:
        return False
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
    return present - UNLISTED == listed


def pull_package(source: str, dest: Path, project_dir: Path, model: str | None = None,
                 version: str | None = None, content_sha256: str | None = None) -> dict[str, str]:
    """`relctl pull`: oci://...@sha256 or MODEL/VERSION into `dest`, verified. `dest` must be new, empty, or a
    package an earlier pull wrote (replaced whole, atomically); anything else is refused before any download.
    `version` (with `model`): the digest must be the one that version's signed publication record names.
    `content_sha256`: the package's content digest a manifest pinned (relctl.package_content_sha256): a
    MODEL/VERSION whose registered package is no longer those bytes is refused, not served."""
    from release.core.outputs import check_new_folder, replace_folder, staging_folder  # noqa: PLC0415
    from release.signing.keys import project_trust  # noqa: PLC0415

    if content_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", content_sha256):
        raise InputError(f"--sha256 {content_sha256!r}: not a sha256 (64 lower-case hex digits)",
                         hint="pass the version's relctl.package_content_sha256 (relctl render kserve writes it)")
    if source.startswith("oci://"):
        parse_oci(source)   # a bad reference fails before anything else
    else:
        from release.deploy.kserve import parse_version_spec  # noqa: PLC0415

        parse_version_spec(source)
    check_new_folder(dest, "--to", reusable=pulled_before)
    trust = project_trust(project_dir)
    dest = dest.absolute()
    with staging_folder(dest) as staged:
        package, verdict = _pull_into(source, staged / "pull", project_dir, trust, model, version)
        if model is not None and package.model_name != model:
            raise InputError(f"{source}: the package is '{package.model_name}', not '{model}'",
                             hint="the pinned reference names another model's package")
        if content_sha256 is not None:
            from release.stages.register import content_sha256 as digest_of  # noqa: PLC0415 - the one definition

            found = digest_of(package)
            if found != content_sha256:
                raise InputError(f"{source}: its package content is sha256 {found}, not the {content_sha256} the "
                                 "manifest pinned", hint="re-render the manifest from the registry "
                                                         "(relctl render kserve), or restore the released package")
        replace_folder(package.root, dest)
    return {"source": source, "to": str(dest), "model": package.model_name,
            "signature": verdict.signed_by or verdict.status}


def _pull_into(source: str, partial: Path, project_dir: Path, trust: Any, model: str | None,
               version: str | None) -> tuple[Any, Any]:
    """The verified package of `source` under `partial`, and its signature verdict: a MODEL/VERSION through
    the one check every registered version goes through; a pinned digest against the signed publication
    record of `model` v`version` when both are given (the init container's pull), else against the keys."""
    from release.registry.client import open_registry  # noqa: PLC0415
    from release.signing.package import verify_signature  # noqa: PLC0415

    if source.startswith("oci://"):
        from release.deploy.pinning import check_pulled  # noqa: PLC0415 - the version's signed record

        root = pull_artifact(source, partial)
        package = verify_package(root)
        verdict = (check_pulled(open_registry(project_dir, read_only=True), model, version, source, root, trust)
                   if model is not None and version is not None else verify_signature(root, trust, source))
        return package, verdict
    from release.deploy.kserve import parse_version_spec  # noqa: PLC0415

    name, number = parse_version_spec(source)
    return fetch_verified(open_registry(project_dir, read_only=True), name, number, partial, trust=trust)


def _check(response: Any, what: str, host: str) -> None:
    """A push's answer: the hint names credentials only for 401/403 (release.deploy.oci_http.check_status)."""
    from release.deploy.oci_http import check_status  # noqa: PLC0415

    check_status(response, what, host, pushing=True)
