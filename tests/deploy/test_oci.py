"""`relctl publish` / `relctl pull`: a released, signed version pushed to a real OCI registry (the CNCF
distribution registry on 127.0.0.1, see conftest.oci_registry) in ModelCar layout, pulled back by digest
and verified; `relctl render kserve` then pins that digest. Tampering in the registry's storage, a moved
tag, an unsigned-by-a-trusted-key package: each refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from release.core.errors import InputError
from release.core.hashing import sha256_tree
from release.core.package import MANIFEST, SIGNATURE
from release.registry import tags as T
from tests.deploy.conftest import GIB, OciRegistry, Project, genai_package, keypair, register
from tests.deploy.test_kserve import IMAGE, container, rendered, schema_problems


@pytest.fixture(scope="module")
def published(project: Project, oci_registry: OciRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """oci-llm v1 (a model of its own, so that the other modules' renders never see an OCI digest), signed,
    published once for the module; its pinned oci://...@sha256 URI."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELCTL_SIGNING_KEY", str(project.private_key))
        mp.setenv("RELCTL_TRUSTED_KEYS", str(project.public_key))
        package = genai_package(tmp_path_factory.mktemp("oci-package"), "cpu", "cpu", model="oci-llm")
        assert register(project, package, "oci-llm", 3 * GIB) == "1"
        # publish signs the record that binds the digest to v1 (release/deploy/pinning.py)
        result = project.relctl("publish", "oci-llm/1", "--to", f"oci://{oci_registry.host}/models/tiny-llm",
                                "--json")
    assert result.exit_code == 0, result.output
    uri: str = json.loads(result.stdout)["uri"]
    return uri


def manifest_of(oci_registry: OciRegistry, uri: str) -> tuple[bytes, dict[str, object]]:
    digest = uri.rsplit("@", 1)[1]
    response = httpx.get(f"http://{oci_registry.host}/v2/models/tiny-llm/manifests/{digest}",
                         headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    assert response.status_code == 200
    return response.content, response.json()


def test_a_released_version_is_published_in_modelcar_layout_and_its_digest_recorded(
        project: Project, oci_registry: OciRegistry, published: str) -> None:
    assert published.startswith(f"oci://{oci_registry.host}/models/tiny-llm@sha256:")
    raw, manifest = manifest_of(oci_registry, published)
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == published.rsplit("@", 1)[1]
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    layers = manifest["layers"]
    assert isinstance(layers, list) and len(layers) == 1
    blob = httpx.get(f"http://{oci_registry.host}/v2/models/tiny-llm/blobs/{layers[0]['digest']}").content
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        names = set(tar.getnames())
    # ModelCar: the package's files under /models, its signature with them
    assert {f"models/{MANIFEST}", f"models/{SIGNATURE}", "models/model/model.onnx",
            "models/model/genai_config.json"} <= names
    from release.registry.client import open_registry

    assert open_registry(project.root).get_version("oci-llm", "1").tags[T.OCI_DIGEST] == published
    again = project.relctl("publish", "oci-llm/1", "--to", f"oci://{oci_registry.host}/models/tiny-llm:again",
                           "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["uri"] == published   # same bytes, same digest


def test_pulled_back_by_digest_and_verified(project: Project, published: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_TRUSTED_KEYS", str(project.public_key))
    result = project.relctl("pull", published, "--to", str(tmp_path / "pkg"), "--model", "oci-llm", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["signature"] == "release.pub"
    listed = json.loads((tmp_path / "pkg" / MANIFEST).read_text())["files"]
    assert {k: v for k, v in sha256_tree(tmp_path / "pkg").items() if k in listed} == listed
    other = project.relctl("pull", published, "--to", str(tmp_path / "other"), "--model", "tiny-chat")
    assert other.exit_code == 2 and "not 'tiny-chat'" in other.stderr and not (tmp_path / "other").exists()


def test_a_package_signed_by_an_untrusted_key_is_refused_naming_the_signer(
        project: Project, published: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, stranger = keypair(tmp_path)
    monkeypatch.setenv("RELCTL_TRUSTED_KEYS", str(stranger))
    result = project.relctl("pull", published, "--to", str(tmp_path / "pkg"))
    assert result.exit_code == 2, result.output
    from release.signing.keys import fingerprint

    signer = fingerprint(project.public_key.read_bytes())[:16]   # the release key that did sign it
    assert f"signed by key {signer}, which is not a trusted key" in result.stderr.splitlines()[0]
    assert not (tmp_path / "pkg").exists()


def test_pull_refuses_a_tag_and_bytes_changed_in_the_registry(project: Project, oci_registry: OciRegistry,
                                                              published: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_TRUSTED_KEYS", str(project.public_key))
    tag = project.relctl("pull", f"oci://{oci_registry.host}/models/tiny-llm:v1", "--to", str(tmp_path / "a"))
    assert tag.exit_code == 2 and "not pinned by digest" in tag.stderr.splitlines()[0]
    _, manifest = manifest_of(oci_registry, published)
    layers = manifest["layers"]
    assert isinstance(layers, list)
    hexdigest = str(layers[0]["digest"]).removeprefix("sha256:")
    stored = oci_registry.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"
    original = stored.read_bytes()
    try:
        stored.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))   # one bit, in the registry's storage
        changed = project.relctl("pull", published, "--to", str(tmp_path / "b"))
    finally:
        stored.write_bytes(original)
    assert changed.exit_code == 2, changed.output
    assert "its layer does not match its digest" in changed.stderr.splitlines()[0]
    assert not (tmp_path / "b").exists()


def test_render_pins_the_published_digest(project: Project, published: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = rendered(project, "oci-llm/1", "--image", IMAGE)
    assert schema_problems(manifest, tmp_path) == []
    assert manifest["metadata"]["annotations"]["relctl/storage-uri"] == published
    predictor = manifest["spec"]["predictor"]
    pull = predictor["initContainers"][0]
    assert pull["command"][pull["command"].index("pull") + 1] == published
    # It pulls into the cache `relctl serve MODEL/VERSION` (the main container) reads: run it as the kubelet
    # would, then serve's resolver finds the package there, checked against the registry's manifest digest.
    cache = tmp_path / "cache"
    cache.mkdir()   # the emptyDir volume
    monkeypatch.setenv("RELCTL_TRUSTED_KEYS", str(project.public_key))
    # The pod's registry (the Secret's MLFLOW_TRACKING_URI): pull checks the digest against v1's signed record.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project.root / '.relctl' / 'mlflow.db'}")
    assert pull["command"][pull["command"].index("--version") + 1] == "1"
    argv = [a.replace("/var/cache/relctl", str(cache)) for a in pull["command"][1:]]
    from click.testing import CliRunner

    from release.cli import cli

    done = CliRunner().invoke(cli, argv)
    assert done.exit_code == 0, done.output
    assert container(manifest)["args"] == ["oci-llm/1"]
    from release.registry.client import open_registry
    from release.serving.source import _cached

    anchor = open_registry(project.root).get_version("oci-llm", "1").tags[T.MANIFEST_SHA256]
    assert _cached(cache / ".relctl" / "serve-cache" / "oci-llm" / "1", anchor) is not None


def test_bad_references_are_exit_2_and_an_unreachable_registry_exit_4_quickly(project: Project, tmp_path: Path) -> None:
    bad = project.relctl("pull", "oci://no-repo", "--to", str(tmp_path / "a"))
    assert bad.exit_code == 2 and bad.stderr.startswith("error: oci://no-repo: not an OCI reference")
    to_digest = project.relctl("publish", "oci-llm/1", "--to", f"oci://127.0.0.1:1/m@sha256:{'a' * 64}")
    assert to_digest.exit_code == 2 and "cannot be pushed to" in to_digest.stderr
    with socket.socket() as closed:   # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    down = project.relctl("pull", f"oci://127.0.0.1:{port}/m@sha256:{'a' * 64}", "--to", str(tmp_path / "b"))
    assert down.exit_code == 4 and "cannot reach the OCI registry" in down.stderr.splitlines()[0]
    assert time.monotonic() - started < 30 and not (tmp_path / "b").exists()


def push_base_image(oci_registry: OciRegistry) -> str:
    """A one-layer base image (Docker's v2 manifest, as `docker push` of busybox writes one) in the local registry,
    through the distribution API itself; its oci://...@sha256 URI."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("bin/sh")
        body = b"#!placeholder shell\n"
        info.size, info.mode = len(body), 0o755
        tar.addfile(info, io.BytesIO(body))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "history": [{"created_by": "base"}]}).encode()
    base = f"http://{oci_registry.host}/v2/base/busybox"
    for blob in (layer, config):
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        session = httpx.post(f"{base}/blobs/uploads/")
        assert session.status_code == 202
        location = httpx.URL(f"http://{oci_registry.host}").join(session.headers["Location"])
        assert httpx.put(location.copy_add_param("digest", digest), content=blob).status_code == 201
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                    "digest": "sha256:" + hashlib.sha256(layer).hexdigest()}]}).encode()
    put = httpx.put(f"{base}/manifests/1", content=manifest,
                    headers={"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"})
    assert put.status_code == 201, put.text
    return f"oci://{oci_registry.host}/base/busybox@sha256:{hashlib.sha256(manifest).hexdigest()}"


def test_a_modelcar_on_a_base_image_is_kserves_storage_uri_and_relctl_serve_verifies_it(
        project: Project, oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp:
        mp.setenv("RELCTL_SIGNING_KEY", str(project.private_key))
        assert register(project, genai_package(tmp_path, "cpu", "cpu", model="car-llm"), "car-llm", GIB) == "1"
    base = push_base_image(oci_registry)
    result = project.relctl("publish", "car-llm/1", "--to", f"oci://{oci_registry.host}/models/car-llm",
                            "--base", base, "--json")
    assert result.exit_code == 0, result.output
    uri = json.loads(result.stdout)["uri"]
    raw = httpx.get(f"http://{oci_registry.host}/v2/models/car-llm/manifests/{uri.rsplit('@', 1)[1]}",
                    headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    image = raw.json()
    # The base image's layer first (under OCI's name for the same bytes), then the package's; the config
    # extends the base's: its shell is there for KServe's ModelCar sidecar (`sh -c ... sleep`).
    assert [layer["mediaType"] for layer in image["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"] * 2
    annotations = image["layers"][1]["annotations"]
    assert annotations["org.opencontainers.image.title"] == "models"
    # The tar's size, pinned with the manifest: what a pull decompresses at most.
    assert set(annotations) == {"org.opencontainers.image.title", "dev.relctl.layer.unpacked-size"}
    assert int(annotations["dev.relctl.layer.unpacked-size"]) > image["layers"][1]["size"]
    config = httpx.get(f"http://{oci_registry.host}/v2/models/car-llm/blobs/{image['config']['digest']}").json()
    assert len(config["rootfs"]["diff_ids"]) == 2 and config["config"]["Cmd"] == ["sh"]
    assert image["annotations"]["org.opencontainers.image.base.name"] == base
    monkeypatch.setenv("RELCTL_TRUSTED_KEYS", str(project.public_key))
    pulled = project.relctl("pull", uri, "--to", str(tmp_path / "pulled"), "--model", "car-llm")
    assert pulled.exit_code == 0, pulled.output
    assert not (tmp_path / "pulled" / "bin").exists() and (tmp_path / "pulled" / MANIFEST).is_file()

    manifest = rendered(project, "car-llm/1", "--image", IMAGE, "--modelcar")
    assert schema_problems(manifest, tmp_path) == []
    c = container(manifest)
    assert {"name": "STORAGE_URI", "value": uri} in c["env"] and "initContainers" not in manifest["spec"]["predictor"]
    assert c["args"] == ["car-llm/1"] and c["command"][:2] == ["/bin/sh", "-c"]
    # The container's command with the ModelCar's /mnt/models standing for the pulled files, up to relctl serve;
    # then serve's own resolver takes the version from its cache, checked against the registry's manifest
    # digest and the signature, without a download from the registry's artifact store.
    state = tmp_path / "state"
    state.mkdir()
    script = c["command"][2].replace("/mnt/models", str(tmp_path / "pulled")).replace("exec relctl serve", "exit 0;")
    done = subprocess.run(["/bin/sh", "-c", script, "relctl-serve", *c["args"]], env={"RELCTL_PROJECT_DIR": str(state),
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    from release.serving.source import resolve_package

    copied = state / ".relctl" / "serve-cache" / "car-llm" / "1" / MANIFEST
    inode = copied.stat().st_ino   # a download would replace the folder (and this file) whole
    served = resolve_package("car-llm/1", state, {
        "MLFLOW_TRACKING_URI": f"sqlite:///{project.root / '.relctl' / 'mlflow.db'}",
        "RELCTL_TRUSTED_KEYS": str(project.public_key)})
    assert (served.identity.name, served.identity.version) == ("car-llm", "1")
    assert served.manifest.root == copied.parent and copied.stat().st_ino == inode
    assert "exec relctl serve --cached-only " in c["command"][2]
    # A ModelCar whose files differ from the released package: refused naming the file, not downloaded
    # again from the artifact store (which would serve the registry's bytes and hide the changed image).
    weights = sorted(p for p in (copied.parent / "model").iterdir() if p.is_file())[0]
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    registry_env = {"MLFLOW_TRACKING_URI": f"sqlite:///{project.root / '.relctl' / 'mlflow.db'}",
                    "RELCTL_TRUSTED_KEYS": str(project.public_key)}
    with pytest.raises(InputError, match=f"{weights.name}.*does not match its sha256"):
        resolve_package("car-llm/1", state, registry_env, cached_only=True)
    assert weights.read_bytes().endswith(b"\0")  # nothing fetched over it
    refused = subprocess.run([str(Path(sys.executable).parent / "relctl"), "serve", "car-llm/1", "--cached-only",
                              "--port", "0", "--project-dir", str(state)], env={**os.environ, **registry_env},
                             capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "does not match its sha256" in refused.stderr, refused.stderr
    with pytest.raises(InputError, match="not in the serve cache"):
        resolve_package("tiny-llm/1", state, registry_env, cached_only=True)
    not_published = project.relctl("render", "kserve", "tiny-llm/1", "--image", IMAGE, "--modelcar")
    assert not_published.exit_code == 2 and "has not been published" in not_published.stderr.splitlines()[0]
