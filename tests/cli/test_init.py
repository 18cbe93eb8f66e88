"""`relctl init`: release.yaml generated from the schema (it cannot drift), the starter files, no
overwrite without --force, and the templates shipped in the wheel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import pytest
import yaml
from click.testing import CliRunner, Result
from pydantic import BaseModel, ValidationError

from release.cli import cli
from release.commands.config_doc import release_yaml_text
from release.commands.init import SOURCE_LINE, STARTER_FILES, init_project
from release.config import ReleaseConfig, load_config
from release.core.errors import ConfigError
from release.core.templates import templates_dir
from release.gating.plugins import available_gates, validate_block

REPO = Path(__file__).resolve().parents[2]


def relctl(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def models_under(model: type[BaseModel], prefix: str = "") -> dict[str, type[BaseModel]]:
    """Every section reachable from `model` through fields (directly or optional), by dotted path."""
    found = {prefix: model}
    for name, field in model.model_fields.items():
        optional = get_origin(field.annotation) in (Union, UnionType)
        for candidate in (field.annotation, *(get_args(field.annotation) if optional else ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found |= models_under(candidate, f"{prefix}.{name}" if prefix else name)
    return found


def mapped_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """Sections used as the values of a map (e.g. eval thresholds per metric) anywhere under `model`."""
    found = []
    for section in models_under(model).values():
        for field in section.model_fields.values():
            if get_origin(field.annotation) is dict:
                value = get_args(field.annotation)[1]
                if isinstance(value, type) and issubclass(value, BaseModel):
                    found.append(value)
    return found


def gate_block(text: str) -> dict[str, Any]:
    """The commented-out `gates:` example at the end of the file, uncommented and parsed."""
    tail = text.split("\ngates: {}\n", 1)[1]
    lines = [line[2:] if line.startswith("# ") else line.removeprefix("#") for line in tail.splitlines()]
    parsed: dict[str, Any] = yaml.safe_load("\n".join(lines))
    return parsed


def lookup(data: Any, dotted: str) -> Any:
    for part in filter(None, dotted.split(".")):
        assert isinstance(data, dict) and part in data, f"{dotted}: '{part}' missing"
        data = data[part]
    return data


def test_generated_release_yaml_loads_as_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text(release_yaml_text())
    assert load_config(path) == ReleaseConfig()


def test_every_schema_field_appears_with_a_comment() -> None:
    text = release_yaml_text()
    data = yaml.safe_load(text)
    for where, model in models_under(ReleaseConfig).items():
        section = lookup(data, where)
        for name in model.model_fields:
            assert name in section, f"release.yaml lacks '{where}.{name}'"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith("#") and ":" in line:
            assert lines[i - 1].lstrip().startswith("#"), f"no comment above '{line.strip()}'"


def test_every_gate_field_appears_and_uncommented_gives_its_defaults() -> None:
    gates = available_gates()
    assert {"eval", "safety", "load"} <= set(gates)
    text = release_yaml_text()
    block = gate_block(text)["gates"]
    assert set(block) == set(gates)
    for gate_id, cls in gates.items():
        off: list[str] = []
        for where, model in models_under(cls.Config).items():
            if any(where.startswith(f"{o}.") for o in off):
                continue
            section = lookup(block[gate_id], where)
            if section is None:  # an optional section off by default: its keys are listed, commented, below it
                off.append(where)
                assert all(re.search(rf"\n[# ]+{name}:[ \n]", text) for name in model.model_fields), where
                continue
            assert set(model.model_fields) <= set(section), f"gates.{gate_id}.{where}"
        for mapped in mapped_models(cls.Config):  # named in the map's comment: {threshold, ...}
            assert "{" + ", ".join(mapped.model_fields) + "}" in release_yaml_text()
        try:
            defaults = cls.Config()
        except ValidationError as exc:  # the gate needs a setting: the starter names it, and the block says so
            assert f"# needs settings: {exc.errors()[0]['msg'].removeprefix('Value error, ')}" in text
            with pytest.raises(ConfigError):
                validate_block(cls, block[gate_id])
            continue
        assert validate_block(cls, block[gate_id]) == defaults


def test_a_new_schema_field_shows_up_without_editing_the_generator() -> None:
    class Extra(BaseModel):
        brand_new_knob: int = 7

    text = release_yaml_text({"extra": Extra})
    assert "#     brand_new_knob: 7" in text


def test_init_writes_the_starter_project(tmp_path: Path) -> None:
    target = tmp_path / "new-project"
    result = relctl("init", str(target))
    assert result.exit_code == 0, result.output
    assert (target / "release.yaml").read_text() == release_yaml_text()
    for dest, name in STARTER_FILES.items():
        assert (target / dest).read_text() == (templates_dir() / name).read_text(), dest
    assert ".relctl/" in (target / ".gitignore").read_text().splitlines()
    assert "set RELCTL_SOURCE" in result.output  # an editable checkout: CI cannot install from it


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "release.yaml").write_text("model: mine\n")
    result = relctl("--project-dir", str(tmp_path), "init")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and "release.yaml already exists" in lines[0]
    assert lines[1].startswith("hint: ") and "--force" in lines[1]
    assert (tmp_path / "release.yaml").read_text() == "model: mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release.yaml"]


def test_force_overwrites_and_gitignore_is_appended_once(tmp_path: Path) -> None:
    (tmp_path / "release.yaml").write_text("model: mine\n")
    (tmp_path / ".gitignore").write_text("*.pyc")
    assert relctl("init", str(tmp_path), "--force", "--json").exit_code == 0
    again = relctl("init", str(tmp_path), "--force", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["gitignore"] == "unchanged"
    assert (tmp_path / ".gitignore").read_text() == "*.pyc\n.relctl/\n"
    assert load_config(tmp_path / "release.yaml") == ReleaseConfig()


def test_known_relctl_source_is_written_into_the_workflow(tmp_path: Path) -> None:
    source = "git+https://github.com/example/relctl@0123456789abcdef"
    assert (templates_dir() / "github-promote.yml").read_text().count(SOURCE_LINE) == 1
    init_project(tmp_path, source=source)
    workflow = yaml.safe_load((tmp_path / ".github/workflows/promote.yml").read_text())
    assert workflow["env"]["RELCTL_SOURCE"] == source


def test_init_into_a_file_is_bad_input(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("x")
    assert relctl("init", str(target)).exit_code == 2


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """relctl's wheel, built once from a copy of the sources (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("release", "gates", "templates"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("relctl-*.whl"))


def test_wheel_ships_the_templates(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in sorted(p.name for p in (REPO / "templates").iterdir()):
        assert f"release/templates/{template}" in names


def test_init_works_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    project = tmp_path / "project"
    code = "import release, sys; print(release.__file__, file=sys.stderr); from release.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-c", code, "init", str(project)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.startswith(str(target)), "the wheel's relctl must be the one that ran"
    # Loads as the defaults (not compared byte for byte: the wheel is the sources as of the fixture, and
    # the schema may move on in a shared checkout while the tests run).
    assert load_config(project / "release.yaml") == ReleaseConfig()
    assert (project / "deploy/Dockerfile").read_text() == (REPO / "templates/Dockerfile").read_text()
    assert (project / ".github/workflows/promote.yml").is_file()


def test_the_shipped_release_yaml_template_is_the_generated_one() -> None:
    """templates/release.yaml is what `relctl init` writes from the schema; regenerate it when the schema moves:
    python -c "from release.commands.config_doc import release_yaml_text as t;
               open('templates/release.yaml','w').write(t())"
    """
    from pathlib import Path

    from release.commands.config_doc import release_yaml_text

    shipped = Path(__file__).resolve().parents[2] / "templates" / "release.yaml"
    assert shipped.read_text() == release_yaml_text()
