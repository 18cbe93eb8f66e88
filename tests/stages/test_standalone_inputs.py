"""The standalone stage commands run promote's intake checks before any slow work, and write OUT as a new
folder: a config.json with wrong types or a tokenizer.json that is not UTF-8 is exit 2 from `relctl convert`,
`merge`, `package` and `validate` (the builder never runs, nothing is written), and a non-empty OUT the
command did not make is refused untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from release.cli import cli
from release.core.package import verify_package


def relctl(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def broken_copy(source: Path, root: Path, defect: str) -> Path:
    folder = root / f"ckpt-{defect}"
    shutil.copytree(source, folder)
    if defect == "config-types":
        config = json.loads((folder / "config.json").read_text())
        config["num_hidden_layers"] = "two"
        config["hidden_size"] = [64]
        (folder / "config.json").write_text(json.dumps(config))
    elif defect == "config-duplicate":
        text = (folder / "config.json").read_text()
        (folder / "config.json").write_text(text.replace("{", '{"hidden_size": 64, ', 1))
    elif defect == "tokenizer-huge":   # sparse: past the 128 MiB bound on paper, nothing on disk
        with (folder / "tokenizer.json").open("r+b") as fh:
            fh.truncate(129 * 1024 * 1024)
    else:
        (folder / "tokenizer.json").write_bytes(b'{"version": "1.0", "model": "\xff\xfe"}')
    return folder


DEFECTS = {"config-types": "config.json", "config-duplicate": "config.json", "tokenizer-not-utf8": "tokenizer.json",
           "tokenizer-huge": "tokenizer.json"}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_convert_refuses_a_bad_checkpoint_before_the_builder(tiny_base_only: Path, tmp_path: Path,
                                                             defect: str) -> None:
    model = broken_copy(tiny_base_only, tmp_path, defect)
    result = relctl("convert", str(model), str(tmp_path / "out"), "--precision", "fp32")
    assert result.exit_code == 2, result.output
    assert DEFECTS[defect] in result.stderr.splitlines()[0], result.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_merge_refuses_a_bad_base(tiny_base_only: Path, tiny_checkpoint: Path, tmp_path: Path, defect: str) -> None:
    base = broken_copy(tiny_base_only, tmp_path, defect)
    result = relctl("merge", str(base), str(tiny_checkpoint), str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert DEFECTS[defect] in result.stderr.splitlines()[0], result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("defect", ["config-types", "config-duplicate"])
def test_package_refuses_a_bad_source_config(tiny_base_only: Path, tmp_path: Path, defect: str) -> None:
    source = broken_copy(tiny_base_only, tmp_path, defect)
    result = relctl("package", str(tiny_base_only), str(source), str(tmp_path / "out"), "--model-name", "tiny-llm",
                    "--precision", "fp32")
    assert result.exit_code == 2, result.output
    assert "config.json" in result.stderr.splitlines()[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_validate_refuses_a_tokenizer_that_is_not_utf8(tiny_base_only: Path, tmp_path: Path) -> None:
    reference = broken_copy(tiny_base_only, tmp_path, "tokenizer-not-utf8")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    result = relctl("validate", str(reference), str(reference), "--prompts", str(prompts))
    assert result.exit_code == 2, result.output
    assert "tokenizer.json" in result.stderr.splitlines()[0], result.stderr


def test_a_non_empty_out_the_command_did_not_make_is_refused_untouched(tiny_base_only: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = relctl("convert", str(tiny_base_only), str(out), "--precision", "fp32")
    assert result.exit_code == 2, result.output
    assert "not empty and relctl did not write it" in result.stderr.splitlines()[0]
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "FILE").write_text("x")
    under_file = relctl("merge", str(tiny_base_only), str(tiny_base_only), str(tmp_path / "FILE" / "out"))
    assert under_file.exit_code == 2 and "is a file, not a folder" in under_file.stderr.splitlines()[0]


def test_a_stage_command_replaces_only_its_own_earlier_out(tiny_base_only: Path, tmp_path: Path) -> None:
    built = tmp_path / "built"
    first = relctl("convert", str(tiny_base_only), str(built), "--precision", "fp32")
    assert first.exit_code == 0, first.output
    again = relctl("convert", str(tiny_base_only), str(built), "--precision", "fp32")
    assert again.exit_code == 0, again.output   # its own earlier output: replaced whole
    assert json.loads((built / ".relctl-output.json").read_text())["command"] == "convert"
    # Another command's output is not this one's to replace.
    merged = relctl("merge", str(tiny_base_only), str(tiny_base_only), str(built))
    assert merged.exit_code == 2 and "not empty and relctl did not write it" in merged.stderr.splitlines()[0]
    # The package command recognises a package by its manifest, and carries no marker into it.
    pkg = tmp_path / "pkg"
    for _ in range(2):
        packaged = relctl("package", str(built), str(tiny_base_only), str(pkg), "--model-name", "tiny-llm",
                          "--precision", "fp32")
        assert packaged.exit_code == 0, packaged.output
    assert not list(pkg.rglob(".relctl-output.json"))
    verify_package(pkg)   # the manifest's files and digests: exactly what is there
    # A file the user added to an earlier output makes it theirs: refused, untouched.
    for folder, command in ((built, ("convert", str(tiny_base_only), str(built), "--precision", "fp32")),
                            (pkg, ("package", str(built), str(tiny_base_only), str(pkg), "--model-name",
                                   "tiny-llm", "--precision", "fp32"))):
        (folder / "notes.txt").write_text("keep me")
        refused = relctl(*command)
        assert refused.exit_code == 2, refused.output
        assert "not empty and relctl did not write it" in refused.stderr.splitlines()[0]
        assert (folder / "notes.txt").read_text() == "keep me"
