"""`relctl render kserve`: the InferenceService validates against KServe's schema (the `kserve` SDK's
models, see kserve_schema.py), pins a version, and the image's entrypoint, run here without Docker,
serves a package with /health 200."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.templates import templates_dir
from release.deploy.facts import VersionFacts
from release.deploy.kserve import MODE_ANNOTATION, KServeOptions, render_kserve, service_name
from tests.deploy.conftest import GIB, Project, free_port, keypair

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


def rendered(project: Project, *args: str) -> dict[str, Any]:
    result = project.relctl("render", "kserve", *args)
    assert result.exit_code == 0, result.output
    manifest: dict[str, Any] = yaml.safe_load(result.stdout)
    return manifest


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = manifest["spec"]["predictor"]["containers"][0]
    return value


def test_rendered_manifest_validates_against_the_inferenceservice_schema(project: Project, tmp_path: Path) -> None:
    plain = rendered(project, "tiny-llm/1", "--image", IMAGE)
    gpu = rendered(project, "models:/tiny-llm/2", "--image", IMAGE, "--memory-gib", "6.5", "--cpu", "4",
                   "--canary-percent", "10", "--namespace", "ml", "--max-replicas", "3")
    raw = rendered(project, "tiny-llm/2", "--image", IMAGE, "--mode", "raw")
    assert plain["apiVersion"] == "serving.kserve.io/v1beta1" and plain["kind"] == "InferenceService"
    for manifest in (plain, gpu, raw):
        assert schema_problems(manifest, tmp_path) == []


def test_the_schema_check_catches_mistakes(project: Project, tmp_path: Path) -> None:
    manifest = rendered(project, "tiny-llm/1", "--image", IMAGE)
    manifest["spec"]["predictor"]["canaryTrafficPercnt"] = 10
    container(manifest)["imagePullPolicyy"] = "Always"
    container(manifest)["ports"][0]["containerPort"] = [8080]
    container(manifest)["startupProbe"]["failureThreshhold"] = 30
    problems = " ".join(schema_problems(manifest, tmp_path))
    assert "canaryTrafficPercnt" in problems and "imagePullPolicyy" in problems and "containerPort" in problems
    assert "failureThreshhold" in problems


def test_a_version_is_pinned_and_a_new_one_is_a_new_revision_of_the_same_service(project: Project) -> None:
    v1 = rendered(project, "tiny-llm/1", "--image", IMAGE)
    v3 = rendered(project, "tiny-llm/3", "--image", IMAGE, "--canary-percent", "10", "--memory-gib", "4")
    assert container(v1)["args"] == ["tiny-llm/1"] and container(v3)["args"] == ["tiny-llm/3"]
    assert v1["metadata"]["name"] == v3["metadata"]["name"] == "tiny-llm"
    assert v3["metadata"]["annotations"]["relctl/version"] == "3"
    assert v3["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert "canaryTrafficPercent" not in v1["spec"]["predictor"]
    assert "@" not in json.dumps(container(v1)["args"])


def test_a_version_that_does_not_exist_exits_2_with_one_line_and_writes_nothing(project: Project,
                                                                                tmp_path: Path) -> None:
    out = tmp_path / "isvc.yaml"
    result = project.relctl("render", "kserve", "tiny-llm/99", "--image", IMAGE, "-o", str(out))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0] == "error: tiny-llm v99 not found" and lines[1].startswith("hint: ")
    assert result.stdout == "" and list(tmp_path.iterdir()) == []
    missing_model = project.relctl("render", "kserve", "no-such-model/1", "--image", IMAGE)
    assert missing_model.exit_code == 2 and missing_model.stdout == ""


def test_memory_is_the_versions_memory_plan_plus_the_serving_process(project: Project) -> None:
    """tiny-llm v1's plan is 3 GiB per replica; relctl serve's process adds 1 GiB (the onnxruntime-genai
    backend's SERVE_PROCESS_BYTES); vLLM's plan already holds its processes, the pod adds a 512 MiB margin."""
    planned = container(rendered(project, "tiny-llm/1", "--image", IMAGE))["resources"]
    assert planned == {"requests": {"cpu": "1", "memory": f"{4 * 1024}Mi"}, "limits": {"memory": f"{4 * 1024}Mi"}}
    chat = container(rendered(project, "tiny-chat/1", "--image", IMAGE))["resources"]
    assert chat["limits"]["memory"] == f"{20 * 1024 + 512}Mi"   # the vllm backend's POD_MARGIN_BYTES on its plan
    given = container(rendered(project, "tiny-llm/1", "--image", IMAGE, "--memory-gib", "6.5"))["resources"]
    assert given["limits"]["memory"] == "6656Mi"
    no_plan = project.relctl("render", "kserve", "tiny-llm/3", "--image", IMAGE)
    assert no_plan.exit_code == 2 and "no memory plan recorded" in no_plan.stderr.splitlines()[0]


def test_the_manifest_names_its_deployment_mode(project: Project) -> None:
    serverless = rendered(project, "tiny-llm/1", "--image", IMAGE, "--canary-percent", "20")
    assert serverless["metadata"]["annotations"][MODE_ANNOTATION] == "Serverless"
    assert serverless["spec"]["predictor"]["canaryTrafficPercent"] == 20
    assert "deploymentStrategy" not in serverless["spec"]["predictor"]
    raw = rendered(project, "tiny-llm/1", "--image", IMAGE, "--mode", "raw")
    assert raw["metadata"]["annotations"][MODE_ANNOTATION] == "RawDeployment"
    assert "canaryTrafficPercent" not in raw["spec"]["predictor"]
    assert raw["spec"]["predictor"]["deploymentStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    split = project.relctl("render", "kserve", "tiny-llm/1", "--image", IMAGE, "--mode", "raw",
                           "--canary-percent", "10")
    assert split.exit_code == 2 and "RawDeployment mode has no traffic split" in split.stderr.splitlines()[0]


def test_a_startup_probe_covers_loading_and_liveness_has_no_fixed_delay(project: Project) -> None:
    c = container(rendered(project, "tiny-llm/1", "--image", IMAGE, "--startup-seconds", "900"))
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": 8080}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900
    assert "initialDelaySeconds" not in c["livenessProbe"] and "initialDelaySeconds" not in startup
    for name in ("kserve-inferenceservice.yaml", "kserve-vllm-inferenceservice.yaml"):
        assert "initialDelaySeconds" not in (templates_dir() / name).read_text()


def test_a_cuda_build_is_scheduled_on_gpu_nodes(project: Project) -> None:
    manifest = rendered(project, "tiny-llm/2", "--image", IMAGE)   # built for CUDA: one GPU by default
    predictor, c = manifest["spec"]["predictor"], container(manifest)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert predictor["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert predictor["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    chosen = rendered(project, "tiny-llm/2", "--image", IMAGE, "--gpus", "2",
                      "--node-selector", "cloud.google.com/gke-accelerator=nvidia-h100-80gb")
    assert chosen["spec"]["predictor"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert container(chosen)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    cpu = rendered(project, "tiny-llm/1", "--image", IMAGE)
    assert "nodeSelector" not in cpu["spec"]["predictor"] and "tolerations" not in cpu["spec"]["predictor"]
    assert "nvidia.com/gpu" not in json.dumps(container(cpu)["resources"])


def test_a_serverless_manifest_names_the_knative_features_it_needs(project: Project) -> None:
    gpu = project.relctl("render", "kserve", "tiny-llm/2", "--image", IMAGE)
    assert gpu.exit_code == 0, gpu.output
    needs = [line for line in gpu.stdout.splitlines() if line.startswith("# Knative rejects this spec")]
    assert needs and needs[0].endswith("kubernetes.podspec-nodeselector, kubernetes.podspec-tolerations")
    chat = project.relctl("render", "kserve", "tiny-chat/1", "--image", IMAGE)
    assert "kubernetes.podspec-init-containers" in chat.stdout.splitlines()[1]
    for quiet in (("tiny-llm/1",), ("tiny-llm/2", "--mode", "raw")):
        result = project.relctl("render", "kserve", *quiet, "--image", IMAGE)
        assert result.exit_code == 0 and "# Knative" not in result.stdout


def test_a_package_is_not_rendered_for_a_device_it_was_not_built_for(project: Project) -> None:
    on_gpu = project.relctl("render", "kserve", "tiny-llm/1", "--image", IMAGE, "--gpus", "1")
    assert on_gpu.exit_code == 2 and on_gpu.stdout == ""
    lines = on_gpu.stderr.strip().splitlines()
    assert len(lines) == 2 and "tiny-llm v1 was built for CPU" in lines[0] and lines[1].startswith("hint: ")
    on_cpu = project.relctl("render", "kserve", "tiny-llm/2", "--image", IMAGE, "--gpus", "0")
    assert on_cpu.exit_code == 2 and "built for CUDA" in on_cpu.stderr.splitlines()[0]


def test_names_are_dns_labels_and_model_names_cannot_change_the_structure() -> None:
    assert service_name("Shop_LLM.v2") == "shop-llm-v2" and service_name("7b") == "m-7b"
    odd = render_kserve(VersionFacts("a: b\n- c", "5", memory={"per_replica_bytes": GIB}), KServeOptions(image=IMAGE))
    assert container(odd)["args"] == ["a: b\n- c/5"] and odd["metadata"]["name"] == "a-b-c"


@pytest.mark.parametrize("args, message", [
    (("tiny-llm@production",), "not a pinned version"),
    (("tiny-llm",), "expected MODEL/VERSION"),
    (("tiny-llm/latest",), "expected MODEL/VERSION"),
    (("tiny-llm/1", "--memory-gib", "0"), "--memory-gib 0"),
    (("tiny-llm/1", "--name", "Bad_Name"), "--name Bad_Name"),
    (("tiny-llm/1", "--node-selector", "no-equals"), "--node-selector no-equals"),
])
def test_bad_input_is_one_line_and_exit_2(project: Project, args: tuple[str, ...], message: str) -> None:
    result = project.relctl("render", "kserve", *args, "--image", IMAGE)
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


def dockerfile_args(path: Path) -> dict[str, str]:
    """The ARG defaults of a Dockerfile."""
    found = re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), flags=re.MULTILINE)
    return dict(found)


def test_cuda_image_runs_the_same_entrypoint_on_python_311_with_pinned_cuda_builds() -> None:
    """Same entrypoint and Python as the CPU image; onnxruntime-genai-cuda pinned to the onnxruntime-genai
    version relctl's own environment runs (the build also refuses to finish if relctl resolved another)."""
    cpu, cuda = templates_dir() / "Dockerfile", templates_dir() / "Dockerfile.cuda"
    assert dockerfile_exec(cpu, "ENTRYPOINT") == dockerfile_exec(cuda, "ENTRYPOINT")
    base = re.findall(r"^FROM (\S+)", cuda.read_text(), flags=re.MULTILINE)
    assert base == re.findall(r"^FROM (\S+)", cpu.read_text(), flags=re.MULTILINE) == ["python:3.11-slim-bookworm"]
    args = dockerfile_args(cuda)
    assert args["ORT_GENAI_VERSION"] == version("onnxruntime-genai")
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["ORT_GPU_VERSION"])
    text = cuda.read_text()
    assert '"onnxruntime-genai-cuda==${ORT_GENAI_VERSION}"' in text
    assert '"onnxruntime-gpu[cuda,cudnn]==${ORT_GPU_VERSION}"' in text
    # The check the build runs: relctl's resolved onnxruntime-genai must be the pinned one.
    check = re.search(r"^RUN (python -c .*ORT_GENAI_VERSION.*)$", text, flags=re.MULTILINE)
    assert check is not None
    for pinned, expect in ((version("onnxruntime-genai"), 0), ("0.0.1", 1)):
        done = subprocess.run(["sh", "-c", check.group(1)], env={**os.environ, "ORT_GENAI_VERSION": pinned,
                              "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == expect, done.stderr


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


def test_image_entrypoint_serves_the_pinned_version(package: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """ENTRYPOINT + the manifest's args and env, joined as the container runtime does; PORT as Knative sets
    it. The Secret names a registry (here an SQLite store holding the registered, signed package); the
    image's cache path is swapped for a writable folder and the trusted-key ConfigMap's file for the
    release's public key. A second start that trusts another key refuses to serve."""
    registry = tmp_path / "registry"
    registry.mkdir()
    private, public = keypair(tmp_path)
    with monkeypatch.context() as mp:
        mp.setenv("RELCTL_SIGNING_KEY", str(private))
        mp.setenv("RELCTL_TRUSTED_KEYS", str(public))  # register refuses a key the project does not trust
        registered = relctl("--project-dir", str(registry), "register", str(package), "--model", "tiny-llm",
                            "--json")
    assert registered.exit_code == 0, registered.output
    manifest = rendered(Project(registry, Path(), Path()), "tiny-llm/1", "--image", IMAGE, "--memory-gib", "4")
    trusted = {e["name"]: e.get("value") for e in container(manifest)["env"]}["RELCTL_TRUSTED_KEYS"]
    assert trusted.startswith("/etc/relctl/trusted-keys/") and any(
        v.get("configMap", {}).get("name") == "relctl-trusted-keys" for v in manifest["spec"]["predictor"]["volumes"])
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    _, other = keypair(stranger)
    refused = subprocess.run(
        [*dockerfile_exec(templates_dir() / "Dockerfile", "ENTRYPOINT"), *container(manifest)["args"]],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
             **container_env(manifest, {"MLFLOW_TRACKING_URI": f"sqlite:///{registry / '.relctl' / 'mlflow.db'}"},
                             {"/var/cache/relctl": str(tmp_path), trusted: str(other)}),
             "PORT": str(free_port()), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "which is not a trusted key" in refused.stderr, refused.stderr[-2000:]
    entrypoint = dockerfile_exec(templates_dir() / "Dockerfile", "ENTRYPOINT")
    secret = {"MLFLOW_TRACKING_URI": f"sqlite:///{registry / '.relctl' / 'mlflow.db'}"}
    cache = tmp_path / "cache"
    cache.mkdir()
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
           **container_env(manifest, secret, {"/var/cache/relctl": str(cache), trusted: str(public)}),
           "PORT": str(port),
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


def test_your_own_copy_of_the_template_is_used(project: Project, tmp_path: Path) -> None:
    """`relctl init` writes deploy/kserve-inferenceservice.yaml; an edited copy renders with --template."""
    assert relctl("init", str(tmp_path)).exit_code == 0
    copy = tmp_path / "deploy" / "kserve-inferenceservice.yaml"
    data = yaml.safe_load(copy.read_text())
    data["metadata"]["labels"]["team"] = "search"
    copy.write_text(yaml.safe_dump(data))
    manifest = rendered(project, "tiny-llm/1", "--image", IMAGE, "--template", str(copy))
    assert manifest["metadata"]["labels"]["team"] == "search" and container(manifest)["args"] == ["tiny-llm/1"]
    assert schema_problems(manifest, tmp_path) == []
    copy.write_text("kind: InferenceService\nspec: {}\n")
    broken = project.relctl("render", "kserve", "tiny-llm/1", "--image", IMAGE, "--template", str(copy))
    assert broken.exit_code == 2 and broken.stderr.startswith("error: KServe template: ")
