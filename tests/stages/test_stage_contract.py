"""The stage contract, fast and against a real SQLite MLflow store: one stage object serves both
`relctl promote` (through the Pipeline) and its subcommand, and register's decisions hold on their own."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from release.cli import cli
from release.config import ServingConfig
from release.core.package import MANIFEST, verify_package
from release.core.progress import Progress
from release.pipeline.runner import Pipeline
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import connect, resolve_store
from release.registry.transitions import NOT_CHECKED, ProductionMoved
from release.stages.package import PackageInputs, PackageStage
from release.stages.register import RegisterInputs, RegisterStage, content_sha256


def runtime_folder(tmp: Path, n: int) -> tuple[Path, Path]:
    """A real (tiny) ONNX graph with a genai config beside it, and a source folder with config.json."""
    runtime, source = tmp / f"runtime{n}", tmp / f"source{n}"
    runtime.mkdir()
    source.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], f"g{n}", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(runtime / "model.onnx"))
    (runtime / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "n": n}}))
    # A whole config.json: the package subcommand runs promote's intake checks on its source folder.
    (source / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 400,
        "max_position_embeddings": 128}))
    return runtime, source


def test_the_package_stage_is_the_same_object_in_promote_and_its_subcommand(tmp_path: Path) -> None:
    runtime, source = runtime_folder(tmp_path, 2)
    fields = {"model_name": "m", "precision": "fp32", "serving": ServingConfig().model_dump()}
    done = Pipeline(tmp_path / "work", Progress(quiet=True)).run(
        PackageStage(PackageInputs(validation="v", fields=fields, runtime_dir=runtime, source_dir=source)))
    out = tmp_path / "by-subcommand"
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "package", str(runtime), str(source), str(out),
                                      "--model-name", "m", "--precision", "fp32", "--json"])
    assert result.exit_code == 0, result.output
    by_pipeline = json.loads((done.path(done.result.package) / MANIFEST).read_text())
    assert json.loads(result.stdout) == by_pipeline == json.loads((out / MANIFEST).read_text())


@pytest.fixture()
def registry(project_dir: Path) -> Registry:
    store = resolve_store(project_dir)
    connect(store)
    return Registry(store)


def register(registry: Registry, tmp: Path, n: int, expected: str | None = NOT_CHECKED,
             target: str = "production") -> tuple[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    runtime, source = runtime_folder(tmp, n)
    out = tmp / f"pkg{n}"
    out.mkdir()
    PackageStage(PackageInputs(validation="v", fields={"model_name": "m", "precision": "fp32"}, runtime_dir=runtime,
                               source_dir=source)).run(out)
    package = verify_package(out / "package")
    inputs = RegisterInputs(model="m", content_sha256=content_sha256(package), lineage={}, extra_tags={},
                            description="d", target=target, expected_production=expected,  # type: ignore[arg-type]
                            package_dir=package.root)
    with registry.release_run("m", "test", {}) as run:
        result = Pipeline(tmp / "work", Progress(quiet=True)).run(RegisterStage(inputs, registry, run, package)).result
    return result.version, result.outcome


def test_register_decides_from_the_registry(registry: Registry, tmp_path: Path) -> None:
    assert register(registry, tmp_path, 1, expected=None) == ("1", "released")
    # The same content again is a no-op, not a twin.
    assert register(registry, tmp_path / "again", 1, expected="1") == ("1", "unchanged")
    # Gates that compared with v1 while production is now v2 may not promote.
    assert register(registry, tmp_path / "b", 2, expected="1") == ("2", "released")
    with pytest.raises(ProductionMoved, match="production moved from v1 to v2"):
        register(registry, tmp_path / "c", 3, expected="1")
    assert sorted(str(v.version) for v in registry.client.search_model_versions("name='m'")) == ["1", "2"]
    # Under a canary the version is `candidate`, production untouched, and stays `registering`.
    assert register(registry, tmp_path / "d", 4, expected="2", target="candidate") == ("3", "candidate")
    assert registry.aliases("m") == {"production": "2", "previous": "1", "candidate": "3"}
    assert registry.get_version("m", "3").tags[T.RELEASE_STATE] == "registering"
    # A later promote of that very package finds the unfinished version instead of making a fourth.
    assert register(registry, tmp_path / "resume", 4, expected="2") == ("3", "released")
    assert registry.aliases("m")["production"] == "3"
