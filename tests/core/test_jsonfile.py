"""The one loader for JSON and YAML files: depth, size and duplicate keys refused, each as one line naming
the file (and the field); and the commands that read release.yaml and package manifests through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.cli import cli
from release.core.errors import InputError
from release.core.jsonfile import MAX_DEPTH, expect, load_json, load_yaml, parse_json


def test_json_depth_size_duplicates_and_constants_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=r"config.json: JSON nested 100000 levels deep; at most 64"):
        load_json(path, "fix it")
    path.write_text('{"a": 1, "b": {"c": 2, "c": 3}}')
    with pytest.raises(InputError, match=r"config.json: key 'c' appears twice"):
        load_json(path, "fix it")
    with pytest.raises(InputError, match="NaN is not a JSON number"):
        parse_json('{"a": NaN}', "payload", "fix it", finite=True)
    path.write_text(json.dumps({"a": "x" * 2000}))
    with pytest.raises(InputError, match=r"config.json: \d+ bytes; at most 1000 are read"):
        load_json(path, "fix it", max_bytes=1000)
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(InputError, match=r"config.json: not UTF-8"):
        load_json(path, "fix it")
    path.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert load_json(path, "fix it") is not None   # the bound itself is accepted


def test_expect_names_the_field_and_the_type(tmp_path: Path) -> None:
    data = {"backend": {"id": 7}, "flag": True}
    with pytest.raises(InputError, match=r"m.json: 'backend.id' is int, not str"):
        expect(data, "backend.id", str, "m.json", "fix it")
    with pytest.raises(InputError, match=r"m.json: 'flag' is bool, not int"):
        expect(data, "flag", int, "m.json", "fix it")
    with pytest.raises(InputError, match=r"m.json: 'files' is missing"):
        expect(data, "files", dict, "m.json", "fix it")


def test_yaml_depth_and_duplicates_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError, match=r"release.yaml: YAML nested more than 64 levels deep"):
        load_yaml(path, "fix it")
    path.write_text("model: a\nconvert:\n  precision: int4\nmodel: b\n")
    with pytest.raises(InputError, match=r"release.yaml: invalid YAML at line 4: key 'model' appears twice"):
        load_yaml(path, "fix it")


@pytest.mark.parametrize(("text", "expected"), [
    ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 64 levels deep"),
    ("model: a\nmodel: b\n", "key 'model' appears twice"),
    ("convert:\n  precision: int4\n  precision: fp32\n", "key 'precision' appears twice"),
])
def test_a_release_yaml_too_deep_or_with_a_duplicate_key_is_exit_2(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "release.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "promote", "0" * 32])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr.splitlines()[0]


@pytest.mark.parametrize("manifest", [b"\x00garbage", b"[]", b'{"files": []}', b'{"files": {"../x": "ab"}}',
                                      b'{"files": {}, "backend": {"id": 3}}', b'{"files": {}, "files": {}}'],
                         ids=["garbage", "list", "files-list", "traversal", "backend-id", "duplicate"])
def test_a_garbage_or_wrong_shaped_package_manifest_is_exit_2(tmp_path: Path, manifest: bytes) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "relctl-package.json").write_bytes(manifest)
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "register", str(package), "--model", "tiny-llm"])
    assert result.exit_code == 2, result.output
    assert "relctl-package.json" in result.stderr.splitlines()[0], result.stderr
    assert not (tmp_path / ".relctl" / "mlflow.db").exists()   # refused before the registry is opened
