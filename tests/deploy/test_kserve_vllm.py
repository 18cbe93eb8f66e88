"""`relctl render kserve` of a vLLM version: a vLLM InferenceService (the vllm/vllm-openai image started with
the package's context and dtype), whose init container fetches and verifies the package before vLLM starts;
the init container's command is run here as the kubelet would, and refuses a package changed in the
artifact store. `relctl init` writes the vLLM template when the project's release.yaml names the vLLM backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from release.backends.vllm.engine import VLLM_VERSION
from release.core.package import MANIFEST
from tests.deploy.conftest import Project
from tests.deploy.test_kserve import IMAGE, container, rendered, schema_problems


def init_container(manifest: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = manifest["spec"]["predictor"]["initContainers"][0]
    return value


def test_a_vllm_version_renders_a_vllm_inferenceservice(project: Project, tmp_path: Path) -> None:
    manifest = rendered(project, "tiny-chat/1", "--image", IMAGE)
    assert schema_problems(manifest, tmp_path) == []
    engine = container(manifest)
    assert engine["image"] == f"vllm/vllm-openai:v{VLLM_VERSION}"
    assert engine["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    args = engine["args"]
    flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flags["--model"] == "/mnt/models/package/model"
    assert flags["--max-model-len"] == "2048" and flags["--dtype"] == "float16"   # from the package's config.json
    assert args[args.index("--served-model-name") + 1: args.index("--served-model-name") + 3] == \
        ["tiny-chat", "tiny-chat:1"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in engine["env"]
    # fp16 weights: a GPU, scheduled on GPU nodes
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert manifest["spec"]["predictor"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    # the package is fetched and verified by relctl (its image) into the volume vLLM reads, before vLLM starts
    pull = init_container(manifest)
    assert pull["image"] == IMAGE
    assert pull["command"][pull["command"].index("pull"):] == [
        "pull", "tiny-chat/1", "--to", "/mnt/models/package", "--model", "tiny-chat"]
    models = {m["name"]: m for m in engine["volumeMounts"]}["relctl-models"]
    assert models["readOnly"] is True and flags["--model"].startswith(models["mountPath"])
    assert any(v["name"] == "relctl-trusted-keys" and v["configMap"]["name"] == "relctl-trusted-keys"
               for v in manifest["spec"]["predictor"]["volumes"])
    raw = rendered(project, "tiny-chat/1", "--image", IMAGE, "--mode", "raw")
    assert schema_problems(raw, tmp_path) == []


def test_a_cpu_vllm_deployment_names_its_own_engine_image(project: Project, tmp_path: Path) -> None:
    fp16_on_cpu = project.relctl("render", "kserve", "tiny-chat/1", "--image", IMAGE, "--gpus", "0",
                                 "--allow-unvalidated-device")
    assert fp16_on_cpu.exit_code == 2 and "float16 weights, which vLLM serves on CUDA only" in fp16_on_cpu.stderr
    # tiny-chat v2 (fp32) was validated on CPU: that is what it renders for by default, and vllm/vllm-openai is
    # a CUDA image, so the CPU engine's image must be named.
    no_image = project.relctl("render", "kserve", "tiny-chat/2", "--image", IMAGE)
    assert no_image.exit_code == 2 and "no default image for cpu" in no_image.stderr.splitlines()[0]
    manifest = rendered(project, "tiny-chat/2", "--image", IMAGE, "--engine-image", "REG/vllm-cpu:1")
    engine = container(manifest)
    assert engine["image"] == "REG/vllm-cpu:1" and "--dtype" in engine["args"]
    assert "nvidia.com/gpu" not in json.dumps(manifest)
    assert "relctl/unvalidated-device" not in manifest["metadata"]["annotations"]
    # The KV pool vLLM takes on CPU is set (as the plan took it), and the limit is the plan's replica (vLLM's
    # processes included) plus the pod's margin: 2 GiB + 512 MiB.
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in engine["env"]
    assert engine["resources"]["limits"]["memory"] == f"{2 * 1024 + 512}Mi"
    assert schema_problems(manifest, tmp_path) == []


def test_a_device_the_version_was_not_validated_on_is_refused_unless_asked(project: Project) -> None:
    """A CPU-validated fp32 vLLM version is not silently rendered for a GPU: only when asked, and then the
    manifest says so."""
    refused = project.relctl("render", "kserve", "tiny-chat/2", "--image", IMAGE, "--gpus", "1")
    lines = refused.stderr.strip().splitlines()
    assert refused.exit_code == 2 and refused.stdout == "" and len(lines) == 2
    assert "validated for cpu" in lines[0] and "--allow-unvalidated-device" in lines[1]
    manifest = rendered(project, "tiny-chat/2", "--image", IMAGE, "--gpus", "1", "--allow-unvalidated-device")
    assert manifest["metadata"]["annotations"]["relctl/unvalidated-device"] == "cuda (validated on cpu only)"
    engine = container(manifest)
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in json.dumps(engine.get("env", []))
    # The same rule for every engine: a CPU onnxruntime-genai build is refused on a GPU node outright.
    genai = project.relctl("render", "kserve", "tiny-llm/1", "--image", IMAGE, "--gpus", "1",
                           "--allow-unvalidated-device")
    assert genai.exit_code == 2 and "cannot run on cuda" in genai.stderr.splitlines()[0]


def run_init_container(project: Project, manifest: dict[str, Any], mnt: Path,
                       monkeypatch: pytest.MonkeyPatch) -> Any:
    """The init container's command as the kubelet runs it: its env (trusted key path mapped to the project's
    public key, the Secret's MLFLOW_TRACKING_URI to the project's store) and /mnt/models mapped to `mnt`."""
    from click.testing import CliRunner

    from release.cli import cli

    pull = init_container(manifest)
    env = {e["name"]: e.get("value") for e in pull["env"]}
    assert env["RELCTL_TRUSTED_KEYS"].startswith("/etc/relctl/trusted-keys/")
    monkeypatch.setenv("RELCTL_TRUSTED_KEYS", str(project.public_key))
    argv = [a.replace("/mnt/models", str(mnt)) for a in pull["command"][1:]]
    argv[argv.index("--project-dir") + 1] = str(project.root)
    return CliRunner().invoke(cli, argv)


def test_the_init_container_verifies_the_package_before_vllm_starts(project: Project, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = rendered(project, "tiny-chat/2", "--image", IMAGE, "--gpus", "1", "--allow-unvalidated-device")
    done = run_init_container(project, manifest, tmp_path / "mnt", monkeypatch)
    assert done.exit_code == 0, done.output
    model_dir = tmp_path / "mnt" / "package" / "model"
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "float32"
    assert (tmp_path / "mnt" / "package" / MANIFEST).is_file()
    # A weights file changed in the artifact store (with write access to it, not to the registry's tags):
    # the init container fails, so vLLM never starts, and nothing is left on the volume.
    # The registry stores the weights once (in the MLflow model, release/registry/package_links.py): the
    # stored copy is the one file under the project with the served bytes.
    served = (model_dir / "model.safetensors").read_bytes()
    stored = [p for p in project.root.rglob("model.safetensors")
              if ".relctl/work" not in p.as_posix() and p.stat().st_size == len(served) and p.read_bytes() == served]
    assert stored, "the served weights are stored nowhere under the project"
    try:
        for path in stored:
            path.write_bytes(served + b"\0")
        again = run_init_container(project, manifest, tmp_path / "mnt2", monkeypatch)
    finally:
        for path in stored:
            path.write_bytes(served)
    assert again.exit_code == 2, again.output
    assert "model/model.safetensors" in again.stderr.splitlines()[0]
    assert not (tmp_path / "mnt2" / "package").exists()


def test_init_writes_the_vllm_template_when_the_config_names_vllm(tmp_path: Path) -> None:
    from release.commands.init import init_project

    plain = init_project(tmp_path / "plain")
    assert "deploy/kserve-vllm-inferenceservice.yaml" not in plain.written
    project = tmp_path / "chat"
    project.mkdir()
    (project / "release.yaml").write_text(yaml.safe_dump({"convert": {"backend": "vllm", "precision": "fp16"}}))
    result = init_project(project, force=True)
    assert "deploy/kserve-vllm-inferenceservice.yaml" in result.written
    written = yaml.safe_load((project / "deploy" / "kserve-vllm-inferenceservice.yaml").read_text())
    assert written["metadata"]["annotations"]["relctl/backend"] == "vllm"
    # the project's own config is kept: it is what chose vLLM
    assert yaml.safe_load((project / "release.yaml").read_text())["convert"]["backend"] == "vllm"


def test_a_vllm_package_is_not_a_modelcar() -> None:
    """vLLM's package is verified by relctl's init container, which cannot see a ModelCar sidecar's files."""
    from release.core.errors import InputError
    from release.deploy.facts import VersionFacts
    from release.deploy.kserve import KServeOptions, render_kserve

    facts = VersionFacts("tiny-chat", "1", "vllm", {"model/config.json": {"dtype": "float16",
                                                                         "max_position_embeddings": 2048}},
                         {"per_replica_bytes": 2**30}, f"oci://r.example/m@sha256:{'a' * 64}")
    with pytest.raises(InputError, match="init container cannot see a ModelCar"):
        render_kserve(facts, KServeOptions(image=IMAGE, modelcar=True))
    pinned = render_kserve(facts, KServeOptions(image=IMAGE))
    assert init_container(pinned)["command"][init_container(pinned)["command"].index("pull") + 1] == facts.oci_uri
