from __future__ import annotations

from pathlib import Path

import pytest

from release.config import ReleaseConfig, load_config
from release.core.errors import ConfigError


def test_no_file_gives_working_defaults() -> None:
    cfg = load_config(None)
    assert cfg.convert.precision == "int4"
    assert 0 < cfg.validation.min_top1_agreement <= 1


def test_unknown_key_gets_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text("convert:\n  precison: fp16\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == "release.yaml: unknown key 'convert.precison'"
    assert info.value.hint == "did you mean 'convert.precision'?"


def test_bad_value_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text("convert:\n  precision: int3\n")
    with pytest.raises(ConfigError, match=r"release.yaml: convert.precision: .*'int3' is not offered by the installed "
                                          r"backends; choose one of ") as refused:
        load_config(path)
    # Every installed backend's precisions, in entry-point order (which plug-ins are installed decides it).
    offered = refused.value.message.rsplit("choose one of ", 1)[1].split(", ")
    assert {"fp32", "fp16", "int8", "int4"} <= set(offered)


def test_the_removed_exporter_key_says_what_replaced_it(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text("convert:\n  exporter: torch\n")
    with pytest.raises(ConfigError, match=r"'convert.exporter' is no longer a key") as info:
        load_config(path)
    assert info.value.hint is not None and "convert.backend" in info.value.hint


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text("model: a\nconvert: [\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(path)


def test_overrides_apply_on_top_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "release.yaml"
    path.write_text("model: tiny\nconvert:\n  precision: fp16\n")
    cfg = load_config(path, {"convert.precision": "int8"})
    assert (cfg.model, cfg.convert.precision) == ("tiny", "int8")


def test_starter_template_loads_as_the_defaults() -> None:
    """templates/release.yaml (what `relctl init` writes) sets nothing: every key shows its default."""
    template = Path(__file__).resolve().parent.parent / "templates" / "release.yaml"
    assert load_config(template) == ReleaseConfig()
