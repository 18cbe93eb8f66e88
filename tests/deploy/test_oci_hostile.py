"""`relctl pull` against hostile registries on 127.0.0.1 (small HTTP servers written here): one that stalls
after `/v2/`, one that trickles, one that answers an oversized manifest, a blob larger than its descriptor,
a layer that is not gzip or is cut short, a 500. Each ends within its deadline in exit 4 (the registry
failed: naming the host and what relctl waited for) or exit 2 (the registry serves other bytes than were
pinned), never exit 3, never a hang, never memory in proportion to what the registry sends; and nothing is
left at --to. Plus the --to folder rules: a non-empty folder relctl did not write is refused untouched."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.errors import RegistryError
from release.deploy.oci import layer_bytes, publish_package

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
Handler = Callable[[BaseHTTPRequestHandler], None]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest_for(layer: bytes, size: int | None = None) -> bytes:
    config = b"{}"
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config),
                                  "size": len(config)},
                       "layers": [{"mediaType": LAYER_TYPE, "digest": sha(layer),
                                   "size": len(layer) if size is None else size,
                                   "annotations": {"org.opencontainers.image.title": "models"}}]}).encode()


class Registry:
    """A registry on 127.0.0.1 whose answers the test chooses: `routes` maps a path prefix to a handler."""

    def __init__(self, routes: dict[str, Handler]) -> None:
        self.requests: list[str] = []
        registry = self

        class Handle(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                registry.requests.append(self.path)
                if self.path == "/v2/":
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                for prefix, handler in routes.items():
                    if self.path.startswith(prefix):
                        try:
                            handler(self)
                        except (BrokenPipeError, ConnectionResetError):
                            pass
                        return
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[dict[str, Handler]], Registry]]:
    started: list[Registry] = []

    def start(routes: dict[str, Handler]) -> Registry:
        started.append(Registry(routes))
        return started[-1]

    yield start
    for registry in started:
        registry.close()


def answer(data: bytes, status: int = 200) -> Handler:
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return handle


def endless(status: int = 200) -> Handler:
    """A body with no declared length that never ends (until the client hangs up)."""
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Connection", "close")
        h.end_headers()
        chunk = b"x" * 65536
        for _ in range(600 * 16):   # 600 MB at most
            h.wfile.write(chunk)
    return handle


def stall(h: BaseHTTPRequestHandler) -> None:
    time.sleep(60)   # no answer at all (the daemon thread dies with the test process)


def trickle(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "1000000")
    h.end_headers()
    for _ in range(120):
        h.wfile.write(b" ")
        h.wfile.flush()
        time.sleep(0.5)


def pull(tmp_path: Path, uri: str, dest: Path | None = None) -> tuple[Result, float]:
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "pull", uri,
                                      "--to", str(dest or tmp_path / "pkg")])
    return result, time.monotonic() - started


def tar_gz(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def test_a_registry_that_stalls_after_v2_is_exit_4_naming_the_host_and_the_wait(
        serve: Callable[[dict[str, Handler]], Registry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_OCI_TIMEOUT_S", "2")
    registry = serve({"/v2/m/manifests/": stall})
    result, took = pull(tmp_path, f"oci://{registry.host}/m@{sha(b'anything')}")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert registry.host in first and "did not answer the manifest of" in first, first
    assert took < 15 and not (tmp_path / "pkg").exists()


def test_a_registry_that_trickles_is_cut_off_at_the_deadline(
        serve: Callable[[dict[str, Handler]], Registry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_OCI_TIMEOUT_S", "2")
    registry = serve({"/v2/m/manifests/": trickle})
    result, took = pull(tmp_path, f"oci://{registry.host}/m@{sha(b'anything')}")
    assert result.exit_code == 4, result.output
    assert registry.host in result.stderr.splitlines()[0]
    assert took < 15


def test_an_oversized_manifest_is_refused_unread(serve: Callable[[dict[str, Handler]], Registry],
                                                  tmp_path: Path) -> None:
    registry = serve({"/v2/m/manifests/": endless()})
    before = psutil.Process().memory_info().rss
    result, took = pull(tmp_path, f"oci://{registry.host}/m@{sha(b'anything')}")
    assert result.exit_code == 2, result.output
    assert "more than the 4194304 bytes" in result.stderr.splitlines()[0]
    assert psutil.Process().memory_info().rss - before < 64 * 1024 * 1024
    assert took < 30


def test_a_blob_larger_than_its_descriptor_is_refused_after_the_pinned_size(
        serve: Callable[[dict[str, Handler]], Registry], tmp_path: Path) -> None:
    layer = tar_gz({"models/relctl-package.json": b"{}"})
    manifest = manifest_for(layer)
    registry = serve({"/v2/m/manifests/": answer(manifest), f"/v2/m/blobs/{sha(layer)}": endless()})
    before = psutil.Process().memory_info().rss
    result, took = pull(tmp_path, f"oci://{registry.host}/m@{sha(manifest)}")
    assert result.exit_code == 2, result.output
    assert f"more than the {len(layer)} bytes pinned" in result.stderr.splitlines()[0]
    assert psutil.Process().memory_info().rss - before < 64 * 1024 * 1024
    assert took < 30 and not (tmp_path / "pkg").exists() and not list(tmp_path.glob(".pkg*"))


@pytest.mark.parametrize("layer", [b"not gzip at all, but pinned", tar_gz({"models/a": b"x" * 5000})[:-40]],
                         ids=["not-gzip", "truncated"])
def test_a_layer_that_is_not_a_complete_gzip_tar_is_exit_2(serve: Callable[[dict[str, Handler]], Registry],
                                                           tmp_path: Path, layer: bytes) -> None:
    manifest = manifest_for(layer)
    registry = serve({"/v2/m/manifests/": answer(manifest), f"/v2/m/blobs/{sha(layer)}": answer(layer)})
    result, _ = pull(tmp_path, f"oci://{registry.host}/m@{sha(manifest)}")
    assert result.exit_code == 2, result.output
    assert "not a complete gzip'd tar" in result.stderr.splitlines()[0]
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("manifest", [b"garbage{", b"[1, 2]", json.dumps({"layers": "x"}).encode(),
                                      json.dumps({"layers": [{"mediaType": LAYER_TYPE, "digest": "sha256:zz",
                                                  "annotations": {"org.opencontainers.image.title": "models"}}]
                                                  }).encode(),
                                      b'{"a": 1, "a": 2}'],
                         ids=["garbage", "list", "layers-not-list", "bad-descriptor", "duplicate-key"])
def test_a_garbage_or_wrong_shaped_manifest_is_exit_2(serve: Callable[[dict[str, Handler]], Registry],
                                                      tmp_path: Path, manifest: bytes) -> None:
    registry = serve({"/v2/m/manifests/": answer(manifest)})
    result, _ = pull(tmp_path, f"oci://{registry.host}/m@{sha(manifest)}")
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 2   # one error line and its hint


def test_a_registry_500_is_exit_4_at_once_without_a_credentials_hint(
        serve: Callable[[dict[str, Handler]], Registry], tmp_path: Path) -> None:
    registry = serve({"/v2/m/manifests/": answer(b"boom", status=500)})
    result, took = pull(tmp_path, f"oci://{registry.host}/m@{sha(b'anything')}")
    assert result.exit_code == 4, result.output
    assert "answered 500" in result.stderr and "docker login" not in result.stderr
    assert "re-run the same command to resume" not in result.stderr
    assert took < 10 and registry.requests.count(registry.requests[-1]) == 1   # no retries


def test_pull_into_a_non_empty_folder_it_did_not_make_is_refused_untouched(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "release.yaml").write_text("model: tiny-llm\n")
    (project / ".relctl").mkdir()
    (project / ".relctl" / "mlflow.db").write_bytes(b"precious")
    result, _ = pull(tmp_path, f"oci://127.0.0.1:1/m@{sha(b'x')}", dest=project)
    assert result.exit_code == 2, result.output
    assert "not empty and relctl did not write it" in result.stderr.splitlines()[0]
    assert (project / "release.yaml").read_text() == "model: tiny-llm\n"
    assert (project / ".relctl" / "mlflow.db").read_bytes() == b"precious"


def test_pull_to_a_path_under_a_file_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "FILE").write_text("x")
    result, _ = pull(tmp_path, f"oci://127.0.0.1:1/m@{sha(b'x')}", dest=tmp_path / "FILE" / "pkg")
    assert result.exit_code == 2, result.output
    assert "is a file, not a folder" in result.stderr.splitlines()[0]
    assert (tmp_path / "FILE").read_text() == "x"


def test_a_version_past_2_63_is_exit_2_before_any_registry_call(tmp_path: Path) -> None:
    too_big = str(2**63)
    for args in (["pull", f"tiny-llm/{too_big}", "--to", str(tmp_path / "p")],
                 ["render", "kserve", f"tiny-llm/{too_big}", "--image", "relctl:1"],
                 ["publish", f"tiny-llm/{too_big}", "--to", "oci://127.0.0.1:1/m"],
                 ["rollback", "tiny-llm", "--to", too_big]):
        result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), *args])
        assert result.exit_code == 2, (args, result.output)
        assert "out of range" in result.stderr.splitlines()[0], (args, result.stderr)
    assert not (tmp_path / ".relctl" / "mlflow.db").exists()


def test_render_into_a_missing_folder_is_exit_2_before_the_registry_is_read(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "render", "kserve", "tiny-llm/1",
                                      "--image", "relctl:1", "-o", str(tmp_path / "missing" / "dir" / "isvc.yaml")])
    assert result.exit_code == 2, result.output
    assert "does not exist" in result.stderr.splitlines()[0]
    assert not (tmp_path / ".relctl" / "mlflow.db").exists()


def headers_byte_by_byte(h: BaseHTTPRequestHandler) -> None:
    """A status line and then header bytes one at a time, forever: each socket read is quick, the whole endless."""
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
        h.wfile.write(bytes([byte]))
        h.wfile.flush()
        time.sleep(0.02)


def test_a_registry_that_sends_its_headers_byte_by_byte_is_cut_off_at_the_deadline(
        serve: Callable[[dict[str, Handler]], Registry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_OCI_TIMEOUT_S", "2")
    registry = serve({"/v2/m/manifests/": headers_byte_by_byte})
    result, took = pull(tmp_path, f"oci://{registry.host}/m@{sha(b'anything')}")
    assert result.exit_code == 4, result.output
    first = result.stderr.splitlines()[0]
    assert registry.host in first and "did not answer the manifest of" in first, first
    assert took < 15 and not (tmp_path / "pkg").exists()


class SlowReader:
    """A registry on 127.0.0.1 that accepts an upload session and then reads the blob 1 KiB per 10 ms."""

    def __init__(self) -> None:
        class Handle(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _empty(self, status: int, location: str | None = None) -> None:
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self._empty(200 if self.path == "/v2/" else 404)

            def do_HEAD(self) -> None:
                self._empty(404)

            def do_POST(self) -> None:
                self._empty(202, location="/v2/m/blobs/uploads/session")

            def do_PUT(self) -> None:
                with contextlib.suppress(OSError):
                    left = int(self.headers.get("Content-Length", "0"))
                    while left > 0:
                        left -= len(self.rfile.read(min(left, 1024)) or b"\0" * left)
                        time.sleep(0.01)
                    self._empty(201)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_large_upload_to_a_registry_that_reads_slowly_is_bounded_by_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELCTL_OCI_TIMEOUT_S", "2")
    monkeypatch.setenv("RELCTL_OCI_MIN_RATE", str(1024**3))   # the blob's share of the deadline: ~0
    package = tmp_path / "package"
    package.mkdir()
    (package / "weights.bin").write_bytes(os.urandom(32 * 1024 * 1024))   # incompressible: a 32 MB layer
    registry = SlowReader()
    started = time.monotonic()
    try:
        with pytest.raises(RegistryError) as raised:
            publish_package(package, f"oci://{registry.host}/m:t", {})
    finally:
        registry.server.shutdown()
        registry.server.server_close()
    took = time.monotonic() - started
    assert registry.host in str(raised.value) and "did not answer upload of a 3" in str(raised.value)
    assert raised.value.exit_code == 4
    assert took < 15   # 32 MiB at 100 KiB/s would take five minutes


def gzip_bomb(unpacked: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("models/zeros.bin")
        info.size = unpacked
        tar.addfile(info, io.BytesIO(bytes(unpacked)))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


@pytest.mark.parametrize("pinned", ["annotation", "default"])
def test_a_layer_that_expands_past_its_pinned_size_is_exit_2_naming_the_layer(
        serve: Callable[[dict[str, Handler]], Registry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        pinned: str) -> None:
    layer = gzip_bomb(64 * 1024 * 1024)   # ~64 KB on the wire
    data = json.loads(manifest_for(layer))
    if pinned == "annotation":   # what `relctl publish` pins: the tar's size
        data["layers"][0]["annotations"]["dev.relctl.layer.unpacked-size"] = "20000"
    else:                        # a layer pushed without it: the documented default bound
        monkeypatch.setenv("RELCTL_OCI_MAX_UNPACKED_BYTES", str(1024 * 1024))
    manifest = json.dumps(data).encode()
    registry = serve({"/v2/m/manifests/": answer(manifest), f"/v2/m/blobs/{sha(layer)}": answer(layer)})
    result, _ = pull(tmp_path, f"oci://{registry.host}/m@{sha(manifest)}")
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert "its layer expands past" in first and registry.host in first, first
    assert not (tmp_path / "pkg").exists()
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 2 * 1024 * 1024


def test_publish_pins_the_unpacked_size_a_pull_stops_at(tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "a.txt").write_bytes(b"x" * 3000)
    layer, _, unpacked = layer_bytes(package)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        assert tar.getnames() == ["models", "models/a.txt"]
    assert unpacked == len(gzip.decompress(layer))
