"""A project whose registry (MLflow on SQLite) holds the versions the deployment tests render, publish and pull:
real packages, registered with `relctl register` and signed with a release key, with the memory plan
figure a release logs (memory.per_replica_bytes) recorded on the versions that have one.

The packages are small but of the real layout: an onnxruntime-genai folder (genai_config.json naming the
execution provider it was built for, model.onnx) or a vLLM folder (config.json with its dtype and context,
model.safetensors, tokenizer.json)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import onnx
import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from onnx import TensorProto, helper

from release.backends import get_backend
from release.cli import cli
from release.core.package import build_package

GIB = 1024**3
REGISTRY_BINARY = Path("/usr/bin/docker-registry")


@dataclass(frozen=True)
class Project:
    root: Path
    public_key: Path
    private_key: Path

    def relctl(self, *args: str) -> Result:
        return CliRunner().invoke(cli, ["--project-dir", str(self.root), *args])


def keypair(folder: Path) -> tuple[Path, Path]:
    """An EC P-256 key pair as PEM files (what `openssl ecparam -name prime256v1 -genkey` gives)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "release.pem", folder / "release.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    private.chmod(0o600)  # a private key readable by others is refused
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def genai_package(root: Path, name: str, provider: str, model: str = "tiny-llm",
                  lineage: dict[str, Any] | None = None) -> Path:
    """An onnxruntime-genai package built for `provider` (its genai_config.json's session options say so).
    `lineage`: what a release records (the checkpoint's base digest, which adapters are bound by)."""
    runtime, source = root / f"{name}-rt", root / f"{name}-src"
    runtime.mkdir()
    source.mkdir()
    options = [{provider: {}}] if provider != "cpu" else []
    (runtime / "genai_config.json").write_text(json.dumps(
        {"model": {"type": "llama", "context_length": 2048, "decoder": {"session_options": {
            "log_id": "onnxruntime-genai", "provider_options": options}}}}))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], name, [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(runtime / "model.onnx"))
    (source / "config.json").write_text(json.dumps({"model_type": "llama"}))
    fields = {"model_name": model, "precision": "int4" if provider == "cpu" else "fp16", "lineage": lineage or {},
              "serving": {}}
    build_package(root / name, runtime, source, fields, get_backend("onnxruntime-genai"))
    return root / name


def vllm_package(root: Path, name: str, dtype: str) -> Path:
    """A vLLM package: safetensors weights, tokenizer and the config vLLM is started from."""
    runtime = root / f"{name}-rt"
    runtime.mkdir()
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256, "head_dim": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "max_position_embeddings": 2048, "vocab_size": 512, "dtype": dtype}
    (runtime / "config.json").write_text(json.dumps(config))
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (runtime / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (runtime / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    fields = {"model_name": "tiny-chat", "precision": {"float16": "fp16", "float32": "fp32"}[dtype], "lineage": {},
              "serving": {}}
    build_package(root / name, runtime, runtime, fields, get_backend("vllm"))
    return root / name


def register(project: Project, package: Path, model: str, per_replica_bytes: int | None) -> str:
    """`relctl register` (signed with the project's release key), then the memory plan figure a release logs."""
    result = project.relctl("register", str(package), "--model", model, "--json")
    assert result.exit_code == 0, result.output
    version = str(json.loads(result.stdout)["version"])
    if per_replica_bytes is not None:
        from release.registry.client import open_registry

        registry = open_registry(project.root)
        mv = registry.get_version(model, version)
        assert mv.run_id is not None
        registry.record_numbers(mv, mv.run_id, {"memory.per_replica_bytes": float(per_replica_bytes)}, {})
    return version


@pytest.fixture(scope="package")
def project(tmp_path_factory: pytest.TempPathFactory, release_keypair: tuple[Path, Path]) -> Iterator[Project]:
    """tiny-llm v1: CPU build, plan 3 GiB; v2: CUDA build, plan 5 GiB; v3: CPU build, no plan.
    tiny-chat v1: vLLM fp16, plan 20 GiB; v2: vLLM fp32, plan 2 GiB. Signed with the session's release key,
    which every test trusts (tests/conftest.py), as a project trusts its own."""
    root = tmp_path_factory.mktemp("deploy-project")
    private, public = release_keypair
    project = Project(root, public, private)
    builds = tmp_path_factory.mktemp("deploy-packages")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELCTL_SIGNING_KEY", str(private))
        mp.setenv("RELCTL_TRUSTED_KEYS", str(public))
        for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
            mp.delenv(key)
        assert register(project, genai_package(builds, "cpu", "cpu"), "tiny-llm", 3 * GIB) == "1"
        assert register(project, genai_package(builds, "cuda", "cuda"), "tiny-llm", 5 * GIB) == "2"
        assert register(project, genai_package(builds, "cpu-no-plan", "cpu"), "tiny-llm", None) == "3"
        assert register(project, vllm_package(builds, "vllm-fp16", "float16"), "tiny-chat", 20 * GIB) == "1"
        assert register(project, vllm_package(builds, "vllm-fp32", "float32"), "tiny-chat", 2 * GIB) == "2"
    # The keys are set for registering only: a test that verifies sets RELCTL_TRUSTED_KEYS itself.
    yield project


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class OciRegistry:
    host: str
    storage: Path


@pytest.fixture(scope="package")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """The CNCF distribution registry (Debian's docker-registry, installed by `make tools`) on 127.0.0.1."""
    assert REGISTRY_BINARY.is_file(), "docker-registry is missing: run `make tools`"
    root = tmp_path_factory.mktemp("oci-registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\n"
                      f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([str(REGISTRY_BINARY), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (root / "registry.log").read_text()
            time.sleep(0.1)
        yield OciRegistry(f"127.0.0.1:{port}", root / "data")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
