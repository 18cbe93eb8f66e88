"""`relctl render kserve`: the InferenceService validates against KServe's schema (the `kserve` SDK's
models, see kserve_schema.py), pins a version, and the image's entrypoint, run here without Docker,
serves a package with /health 200."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.templates import templates_dir
from release.deploy.kserve import KServeOptions, render_kserve, service_name

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / ".relctl-tools" / "kserve-sdk"
VALIDATOR = Path(__file__).with_name("kserve_schema.py")
IMAGE = "registry.example.com/relctl-serve:0.1.0"


def relctl(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def schema_problems(manifest: dict[str, Any], tmp_path: Path) -> list[str]:
    assert (SDK / "kserve" / "models").is_dir(), "KServe's SDK is missing: run `make tools`"
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    done = subprocess.run([sys.executable, str(VALIDATOR), str(SDK), str(path)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    problems: list[str] = json.loads(done.stdout)
    return problems


def rendered(*args: str) -> dict[str, Any]:
    result = relctl("render", "kserve", *args)
    assert result.exit_code == 0, result.output
    manifest: dict[str, Any] = yaml.safe_load(result.stdout)
    return manifest


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = manifest["spec"]["predictor"]["containers"][0]
    return value


def test_rendered_manifest_validates_against_the_inferenceservice_schema(tmp_path: Path) -> None:
    plain = rendered("tiny-llm/3", "--image", IMAGE)
    gpu = rendered("models:/tiny-llm/4", "--image", IMAGE, "--gpus", "1", "--memory-gib", "6.5", "--cpu", "4",
                   "--canary-percent", "10", "--namespace", "ml", "--max-replicas", "3")
    assert plain["apiVersion"] == "serving.kserve.io/v1beta1" and plain["kind"] == "InferenceService"
    assert schema_problems(plain, tmp_path) == []
    assert schema_problems(gpu, tmp_path) == []


def test_the_schema_check_catches_mistakes(tmp_path: Path) -> None:
    manifest = rendered("tiny-llm/3", "--image", IMAGE)
    manifest["spec"]["predictor"]["canaryTrafficPercnt"] = 10
    container(manifest)["imagePullPolicyy"] = "Always"
    container(manifest)["ports"][0]["containerPort"] = [8080]
    problems = " ".join(schema_problems(manifest, tmp_path))
    assert "canaryTrafficPercnt" in problems and "imagePullPolicyy" in problems and "containerPort" in problems


def test_a_version_is_pinned_and_a_new_one_is_a_new_revision_of_the_same_service() -> None:
    v3 = rendered("tiny-llm/3", "--image", IMAGE)
    v4 = rendered("tiny-llm/4", "--image", IMAGE, "--canary-percent", "10")
    assert container(v3)["args"] == ["tiny-llm/3"] and container(v4)["args"] == ["tiny-llm/4"]
    assert v3["metadata"]["name"] == v4["metadata"]["name"] == "tiny-llm"
    assert v4["metadata"]["annotations"]["relctl/version"] == "4"
    assert v4["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert "canaryTrafficPercent" not in v3["spec"]["predictor"]
    assert "@" not in json.dumps(container(v3)["args"])


def test_resources_credentials_metrics_cache_and_probes() -> None:
    manifest = rendered("tiny-llm/3", "--image", IMAGE, "--gpus", "2", "--memory-gib", "6.5", "--cpu", "500m",
                        "--cache-gib", "20", "--secret", "mlflow-creds")
    c = container(manifest)
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "6656Mi", "nvidia.com/gpu": "2"},
                              "limits": {"memory": "6656Mi", "nvidia.com/gpu": "2"}}
    env = {e["name"]: e for e in c["env"]}
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "RELCTL_API_KEY"):
        assert env[key]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-creds" and "value" not in env[key]
    assert env["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"].get("optional") is not True
    predictor = manifest["spec"]["predictor"]
    port = c["ports"][0]["containerPort"]
    assert predictor["annotations"]["prometheus.io/scrape"] == "true"
    assert predictor["annotations"]["prometheus.io/port"] == str(port)
    assert manifest["metadata"]["annotations"]["serving.kserve.io/enable-prometheus-scraping"] == "true"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": port}
    mount = c["volumeMounts"][0]
    volume = next(v for v in predictor["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"] == {"sizeLimit": "20Gi"} and env["RELCTL_PROJECT_DIR"]["value"] == mount["mountPath"]


def test_names_are_dns_labels_and_model_names_cannot_change_the_structure() -> None:
    assert service_name("Shop_LLM.v2") == "shop-llm-v2" and service_name("7b") == "m-7b"
    odd = render_kserve("a: b\n- c/5", KServeOptions(image=IMAGE))
    assert container(odd)["args"] == ["a: b\n- c/5"] and odd["metadata"]["name"] == "a-b-c"


@pytest.mark.parametrize("args, message", [
    (("tiny-llm@production",), "not a pinned version"),
    (("tiny-llm",), "expected MODEL/VERSION"),
    (("tiny-llm/latest",), "expected MODEL/VERSION"),
    (("tiny-llm/3", "--memory-gib", "0"), "--memory-gib 0"),
    (("tiny-llm/3", "--name", "Bad_Name"), "--name Bad_Name"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = relctl("render", "kserve", *args, "--image", IMAGE)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and message in lines[0] and lines[1].startswith("hint: ")


def dockerfile_exec(path: Path, instruction: str) -> list[str]:
    """The JSON (exec) form of ENTRYPOINT or CMD in a Dockerfile."""
    text = path.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(instruction + " ")]
    assert len(lines) == 1, f"{path.name}: one {instruction} expected"
    value: list[str] = json.loads(lines[0][len(instruction) + 1:])
    return value


def test_cuda_image_runs_the_same_entrypoint() -> None:
    cpu, cuda = templates_dir() / "Dockerfile", templates_dir() / "Dockerfile.cuda"
    assert dockerfile_exec(cpu, "ENTRYPOINT") == dockerfile_exec(cuda, "ENTRYPOINT")
    assert "onnxruntime-gpu" in cuda.read_text() and "onnxruntime-genai-cuda" in cuda.read_text()


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The serving tests' tiny random Llama, packaged with the manifest fields promote writes (so that
    `relctl register` takes it)."""
    from release.backends import backend_for_folder
    from release.core.package import build_package
    from tests.serving.tinymodel import build_genai, build_hf_model

    root = tmp_path_factory.mktemp("kserve-package")
    hf = build_hf_model(root / "hf")
    genai = build_genai(hf, root / "genai")
    fields = {"model_name": "tiny-llm", "precision": "fp32", "exporter": {"exporter": "genai", "versions": {}},
              "lineage": {"run_id": "test"}, "serving": {}}
    build_package(root / "package", genai, hf, fields, backend_for_folder(genai))
    return root / "package"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def container_env(manifest: dict[str, Any], secret: dict[str, str], paths: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it from the manifest: literal values, and
    secretKeyRef values from `secret` (an optional key that is absent sets nothing). `paths` maps the
    image's own paths to writable folders here."""
    env: dict[str, str] = {}
    for var in container(manifest)["env"]:
        if "value" in var:
            env[var["name"]] = paths.get(var["value"], var["value"])
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        if ref["key"] in secret:
            env[var["name"]] = secret[ref["key"]]
        else:
            assert ref.get("optional") is True, f"secret key {ref['key']} is required"
    return env


def test_image_entrypoint_serves_the_pinned_version(package: Path, tmp_path: Path) -> None:
    """ENTRYPOINT + the manifest's args and env, joined as the container runtime does; PORT as Knative sets
    it. The Secret names a registry (here an SQLite store holding the registered package); the image's
    cache path is swapped for a writable folder."""
    registry = tmp_path / "registry"
    registry.mkdir()
    registered = relctl("--project-dir", str(registry), "register", str(package), "--model", "tiny-llm", "--json")
    assert registered.exit_code == 0, registered.output
    manifest = rendered("tiny-llm/1", "--image", IMAGE)
    entrypoint = dockerfile_exec(templates_dir() / "Dockerfile", "ENTRYPOINT")
    secret = {"MLFLOW_TRACKING_URI": f"sqlite:///{registry / '.relctl' / 'mlflow.db'}"}
    cache = tmp_path / "cache"
    cache.mkdir()
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
           **container_env(manifest, secret, {"/var/cache/relctl": str(cache)}), "PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*entrypoint, *container(manifest)["args"]], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert health is not None and health.status_code == 200, log.read_text()[-3000:]
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert models.headers["X-Relctl-Model"] == "tiny-llm" and models.headers["X-Relctl-Version"] == "1"
        # `exec` in the entrypoint: the server is the container's main process and gets SIGTERM itself.
        assert "relctl" in Path(f"/proc/{proc.pid}/cmdline").read_text()
        assert list(cache.rglob("relctl-package.json")), "the package is cached on the writable volume"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=40)


def test_your_own_copy_of_the_template_is_used(tmp_path: Path) -> None:
    """`relctl init` writes deploy/kserve-inferenceservice.yaml; an edited copy renders with --template."""
    assert relctl("init", str(tmp_path)).exit_code == 0
    copy = tmp_path / "deploy" / "kserve-inferenceservice.yaml"
    data = yaml.safe_load(copy.read_text())
    data["metadata"]["labels"]["team"] = "search"
    copy.write_text(yaml.safe_dump(data))
    manifest = rendered("tiny-llm/3", "--image", IMAGE, "--template", str(copy))
    assert manifest["metadata"]["labels"]["team"] == "search" and container(manifest)["args"] == ["tiny-llm/3"]
    assert schema_problems(manifest, tmp_path) == []
    copy.write_text("kind: InferenceService\nspec: {}\n")
    broken = relctl("render", "kserve", "tiny-llm/3", "--image", IMAGE, "--template", str(copy))
    assert broken.exit_code == 2 and broken.stderr.startswith("error: KServe template: ")
