"""The registry side of adapters, cheap and in process (no engine starts): an adapter rollback never lands on a
version built for another base version (decided from its signed package, not its tags); `rollback ADAPTER
--server` checks the key, the server and its base before the alias moves, and says plainly when production
moved and the switch did not follow; a base promote that would strand production adapters is refused,
naming them; `relctl status` shows base <-> adapters and the servers that recorded themselves (stale ones
marked).

Real parts: MLflow on SQLite, base versions as a release tags them (tests/adapters/test_base_match.py),
adapter versions as real signed packages of the example run's PEFT files (register, signature and all;
only the engine's export and the validation are left out: they are not what these tests are about), and
real HTTP servers on 127.0.0.1 standing in for what a --server URL can point at (a dead port, an HTML page,
a server that takes the probe and then fails the switch). The running relctl serve is
tests/adapters/test_ort_adapters.py's.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from safetensors.numpy import load_file, save_file

from release.adapters.package import ADAPTER_FILES, AdapterPackaging
from release.backends import get_backend
from release.config import ServingConfig, SigningConfig
from release.core.package import build_package
from release.registry import PREVIOUS, PRODUCTION, Registry
from release.registry import tags as T
from release.registry.servers import ServerRecord, record_server
from release.registry.store import connect, resolve_store
from release.signing.keys import release_key
from release.stages.register import RegisterInputs, RegisterStage, content_sha256
from tests.adapters.test_base_match import BASE, adapter_version, base_version, relctl
from tests.conftest import load_train_module

SUPPORT = f"{BASE}-support"
OLD = f"{BASE}-old"
D1, D2 = "sha256:" + "11" * 32, "sha256:" + "22" * 32


def registry_of(project: Path) -> Registry:
    store = resolve_store(project)
    connect(store)
    return Registry(store)


def signed_adapter(project: Path, work: Path, checkpoint: Path, name: str, base: str, digest: str, scale: float,
                   manifest_base: str | None = None) -> str:
    """A version of adapter `name` as an adapter release registers it: a signed package of the run's PEFT
    files (lora_B scaled by `scale`: another adapter), its manifest naming BASE v`manifest_base` (default
    `base`), its tags BASE v`base` (a tag that lies when the two differ); made production."""
    exported = work / f"{name}-{scale}" / "adapter"
    exported.mkdir(parents=True)
    for file in ADAPTER_FILES:
        shutil.copy2(checkpoint / file, exported / file)
    weights = exported / "adapter_model.safetensors"
    save_file({k: v * scale if "lora_B" in k else v for k, v in load_file(weights).items()}, weights)
    fields = {"model_name": name, "precision": "fp32", "lineage": {}, "kind": "adapter",
              "serving": ServingConfig().model_dump(mode="json"),
              "base": {"model": BASE, "version": manifest_base or base, "sha256": digest, "package_content_sha256": ""},
              "validation": {"metrics": {}, "passed": True}}
    package = build_package(exported.parent / "package", exported, checkpoint, fields,
                            AdapterPackaging(get_backend("onnxruntime-genai"), ""))
    registry = registry_of(project)
    extra = {T.KIND: "adapter", T.BASE_MODEL: BASE, T.BASE_VERSION: base, T.BASE_SHA256: digest}
    with registry.release_run(name, f"test adapter {name}", {}) as run:
        inputs = RegisterInputs(model=name, content_sha256=content_sha256(package), lineage={}, extra_tags=extra,
                                description=f"{name} for {BASE} v{base}", package_dir=package.root)
        result = RegisterStage(inputs, registry, run, package, release_key(SigningConfig(), project)).run(
            exported.parent / "register")
    assert result.outcome == "released", result
    return result.version


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory, tiny_run: Any) -> dict[str, Any]:
    """tiny-llm v1 then v2 (production); the support adapter's v1 built for v1, v2 and v3 for v2 (production
    v3, previous v2); an `old` adapter (tags only) whose production is built for v1. Tests leave the aliases as
    they found them."""
    root = tmp_path_factory.mktemp("adapter-registry")
    project = root / "project"
    project.mkdir()
    checkpoint = tiny_run.checkpoint_dir
    versions = {"base1": base_version(project, D1)}
    versions["s1"] = signed_adapter(project, root, checkpoint, SUPPORT, versions["base1"], D1, 1.0)
    adapter_version(project, OLD, versions["base1"], D1)
    versions["base2"] = base_version(project, D2)
    versions["s2"] = signed_adapter(project, root, checkpoint, SUPPORT, versions["base2"], D2, 2.0)
    versions["s3"] = signed_adapter(project, root, checkpoint, SUPPORT, versions["base2"], D2, 3.0)
    return {"project": project, "root": root, "v": versions}


def aliases(project: Path, model: str = SUPPORT) -> dict[str, str]:
    return registry_of(project).aliases(model)


def test_adapter_rollback_onto_a_version_built_for_the_old_base_is_refused(moved: dict[str, Any]) -> None:
    """After the base moved to v2, `rollback ADAPTER --to V` onto a version built for v1 is exit 2 naming both
    base versions, decided from the signed package: rewriting the version's base tag changes nothing."""
    project, v = moved["project"], moved["v"]
    before = aliases(project)
    refused = relctl(project, "rollback", SUPPORT, "--to", v["s1"])
    assert refused.exit_code == 2, refused.output
    error = refused.stderr.splitlines()[0]
    assert f"built for {BASE} v{v['base1']}" in error and f"{BASE}'s production is v{v['base2']}" in error, error
    assert "signed package" in error and aliases(project) == before
    # The tag says v2 now; the signed manifest still says v1.
    registry = registry_of(project)
    registry.set_version_tags(SUPPORT, v["s1"], {T.BASE_VERSION: v["base2"]})
    try:
        again = relctl(project, "rollback", SUPPORT, "--to", v["s1"])
        assert again.exit_code == 2 and f"built for {BASE} v{v['base1']}" in again.stderr, again.output
    finally:
        registry.set_version_tags(SUPPORT, v["s1"], {T.BASE_VERSION: v["base1"]})
    assert aliases(project) == before


class Stub(BaseHTTPRequestHandler):
    """What a --server URL may point at instead of a relctl serve --adapters that can switch."""

    mode = "html"         # html: a login page or proxy; relctl-v1 / relctl-v2: takes the probe as relctl serve
    posts: list[str] = []  # noqa: RUF012 - one stub per test, sequential
    weights: str | None = None  # the base-weights digest it states (None: the one its version was built from)

    def log_message(self, *_: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        for k, val in (headers or {}).items():
            self.send_header(k, val)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.mode == "html":
            self._send(200, b"<html><body>Please sign in</body></html>", "text/html")
            return
        version = self.mode.removeprefix("relctl-v")  # the base as relctl serve --adapters states it
        base = {"model": BASE, "version": version, "sha256": self.weights or (D1 if version == "1" else D2),
                "package_content_sha256": "sha256:" + "99" * 32}
        self._send(200, json.dumps({"base": base, "adapters": [], "in_flight": {}, "draining": {}}).encode(),
                   "application/json", {"x-relctl-model": BASE, "x-relctl-version": version})

    def do_POST(self) -> None:
        self.posts.append(self.path)
        self._send(502, b"<html><body>Bad gateway</body></html>", "text/html")  # the switch fails after the probe


@pytest.fixture()
def stub() -> Iterator[tuple[str, type[Stub]]]:
    handler = type("StubHandler", (Stub,), {"posts": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_rollback_with_server_checks_key_server_and_base_before_the_alias_moves(
        moved: dict[str, Any], stub: tuple[str, type[Stub]], monkeypatch: pytest.MonkeyPatch) -> None:
    """No admin key, a dead server, a server answering HTML, a relctl server of another base version or of that
    version's number on other base weights (the signed package's binding, as the server's switch checks it):
    each is refused before the alias moves (exit 2, or 4 for a server that cannot be reached; never 3), saying
    nothing moved."""
    project = moved["project"]
    url, handler = stub
    before = aliases(project)
    monkeypatch.delenv("RELCTL_ADMIN_KEY", raising=False)

    def refused(server: str, code: int, *words: str) -> Result:
        result = relctl(project, "rollback", SUPPORT, "--server", server)
        assert result.exit_code == code, (server, result.output)
        lines = result.stderr.splitlines()
        assert len(lines) == 2 and lines[1].startswith("hint: "), lines
        assert "nothing moved" in lines[0] and all(w in lines[0] for w in words), lines
        assert aliases(project) == before
        return result

    refused(url, 2, "RELCTL_ADMIN_KEY")
    monkeypatch.setenv("RELCTL_ADMIN_KEY", "admin-key")
    refused(f"http://127.0.0.1:{dead_port()}", 4, "cannot reach it")
    refused(url, 2, "text/html", "not relctl serve's JSON")
    handler.mode = "relctl-v1"   # a relctl server, but of the base version production has left
    refused(url, 2, f"bound by its signed package to {BASE} v{moved['v']['base2']}",
            f"would serve on, {BASE} v{moved['v']['base1']}")
    handler.mode, handler.weights = f"relctl-v{moved['v']['base2']}", D1  # that version number, other weights
    refused(url, 2, "(they differ in: base weights)")
    assert handler.posts == []   # no switch was ever asked for


def test_a_switch_that_fails_after_the_move_says_production_moved_and_how_to_undo(
        moved: dict[str, Any], stub: tuple[str, type[Stub]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The server took the probe, then failed the switch (a proxy answering 502 in HTML): exit 4 (not 3), the
    error says production moved, the hint holds the exact command that moves it back, which works."""
    project, v = moved["project"], moved["v"]
    url, handler = stub
    handler.mode = f"relctl-v{v['base2']}"
    monkeypatch.setenv("RELCTL_ADMIN_KEY", "admin-key")
    before = aliases(project)
    result = relctl(project, "rollback", SUPPORT, "--server", url)
    assert result.exit_code == 4, result.output
    error, hint = result.stderr.splitlines()
    assert error.startswith(f"error: {SUPPORT}: production moved from v{before[PRODUCTION]} to v{before[PREVIOUS]}, "
                            f"but the switch on {url} failed"), error
    assert handler.posts == ["/admin/adapters"] and aliases(project)[PRODUCTION] == before[PREVIOUS]
    undo = hint.removeprefix("hint: to undo it: ").split("; to keep it")[0]
    args = shlex.split(undo)
    assert args[:2] == ["relctl", "--project-dir"] and args[3:6] == ["rollback", SUPPORT, "--to"], undo
    undone = relctl(Path(args[2]), *args[3:])
    assert undone.exit_code == 0, undone.output
    assert aliases(project)[PRODUCTION] == before[PRODUCTION]


def test_a_base_promote_that_would_strand_adapters_is_refused(tiny_run: Any, moved: dict[str, Any]) -> None:
    """promote of a new base version while production adapters are built for the current one: exit 2 naming
    them, before any stage; `--strand-adapters` or release.yaml's release.strand_adapters lets it go on (here
    it then stops at another contract problem, so nothing slow runs)."""
    project, v = moved["project"], moved["v"]
    run_id = load_train_module().log_run(tiny_run, project, experiment=BASE)
    config = moved["root"] / "strand.yaml"
    config.write_text(f"model: {BASE}\n")
    result = relctl(project, "promote", run_id, "-c", str(config))
    assert result.exit_code == 2, result.output
    assert f"stranding the production adapters built for it: {SUPPORT} v{v['s3']}" in result.stderr, result.stderr
    assert "--strand-adapters" in result.stderr and "✓" not in result.stderr  # no stage ran
    assert OLD not in result.stderr  # built for v1: production left it already
    checked = relctl(project, "check", run_id, "-c", str(config), "--json")
    assert any(SUPPORT in p["error"] for p in json.loads(checked.stdout)["problems"]), checked.output
    # Allowed by the flag or by release.yaml: the stranding problem goes, the other one (a missing prompts
    # file) stays and stops the release before anything slow.
    for args, rule in ((["--strand-adapters"], ""), ([], "release:\n  strand_adapters: true\n")):
        config.write_text(f"model: {BASE}\n{rule}validation:\n  prompts: missing.jsonl\n")
        allowed = relctl(project, "promote", run_id, "-c", str(config), *args)
        assert allowed.exit_code == 2 and "missing.jsonl" in allowed.stderr, allowed.output
        assert SUPPORT not in allowed.stderr, allowed.stderr
    assert aliases(project, BASE)[PRODUCTION] == v["base2"]


def test_status_shows_base_and_adapters_both_ways_and_marks_stale_servers(moved: dict[str, Any]) -> None:
    """status BASE: the production adapters by the base version they were built for (one built for a version
    production left: stranded) and the servers recorded on the base, each with what it serves other than
    production; a server whose heartbeat stopped is STALE. status ADAPTER: the base its versions were built
    for and that base's production, and the servers serving it."""
    project, v = moved["project"], moved["v"]
    v1, v2 = v["base1"], v["base2"]
    now = datetime.now(UTC)
    live = ServerRecord(id="h.1.aa", url="http://127.0.0.1:8001", host="h", pid=1, base_model=BASE, base_version=v1,
                        adapters={OLD: "1"}, started=now.isoformat(), last_seen=now.isoformat())
    gone = ServerRecord(id="h.2.bb", url="http://127.0.0.1:8002", host="h", pid=2, base_model=BASE, base_version=v2,
                        adapters={SUPPORT: v["s3"]}, started=(now - timedelta(hours=1)).isoformat(),
                        last_seen=(now - timedelta(minutes=10)).isoformat())
    registry = registry_of(project)
    for record in (live, gone):
        record_server(registry, record)
    data = json.loads(relctl(project, "status", BASE, "--json").stdout)
    assert data["aliases"][PRODUCTION]["adapters"] == {SUPPORT: v["s3"]}
    assert {(a["model"], a["base_version"]) for a in data["adapters"]} == {(SUPPORT, v2), (OLD, v1)}
    servers = {s["url"]: s for s in data["servers"]}
    assert servers[live.url]["stale"] is False and servers[gone.url]["stale"] is True
    assert servers[live.url]["differs"] == [f"runs {BASE} v{v1}; production is v{v2}"]
    assert servers[gone.url]["serves_production"] is True  # what it said before it went quiet
    text = relctl(project, "status", BASE).stdout
    assert f"{BASE} v{v1} production adapters: {OLD} v1 (stranded" in text
    assert f"server {gone.url}" in text and "STALE" in text.split(f"server {gone.url}")[1].splitlines()[0]
    assert f"not production: runs {BASE} v{v1}; production is v{v2}" in text
    adapter = json.loads(relctl(project, "status", OLD, "--json").stdout)
    assert adapter["adapter_of"] == {"model": BASE, "production": v2, "built_for": {PRODUCTION: v1}}
    assert [s["url"] for s in adapter["servers"]] == [live.url]
    assert "no production base serves it" in relctl(project, "status", OLD).stdout
