"""`relctl plan` through the relctl group: the verdict, JSON, the plot, and each bad input as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from release.backends.onnxruntime_genai.plan import Target, breakdown
from release.backends.onnxruntime_genai.verdict import load_spec
from release.cli import cli

FIXTURES = Path(__file__).parent / "fixtures"
MISTRAL = str(FIXTURES / "mistral-7b.json")


def plan(*args: str, project: Path | None = None) -> tuple[int, str, str]:
    base = ["--project-dir", str(project)] if project else []
    result = CliRunner().invoke(cli, [*base, "plan", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_plan_that_fits_prints_json_and_a_plot(tmp_path: Path) -> None:
    code, out, _ = plan(MISTRAL, "--gpu", "H100-80GB", "--concurrency", "4", "--context", "4096", "--precision",
                        "fp16", "--json", "--plot", str(tmp_path / "p.png"), project=tmp_path)
    assert code == 0
    data = json.loads(out)
    expected = breakdown(load_spec(Path(MISTRAL), "fp16", "cuda"), Target(memory_gib=80, concurrency=4, context=4096))
    assert data["fits"] and data["breakdown"]["peak"] == expected.peak
    assert data["breakdown"]["kv_cache"] == 2 * 32 * 8 * 128 * 2 * 4 * 4096
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plan_that_does_not_fit_exits_1_and_says_what_would(tmp_path: Path) -> None:
    code, out, _ = plan(MISTRAL, "--gpu", "A100-80GB", "--concurrency", "64", "--context", "8192", "--precision",
                        "fp16", "--json", project=tmp_path)
    data = json.loads(out)
    assert code == 1 and not data["fits"]
    assert data["max_concurrency"] < 64
    assert f"largest concurrency at 8192 tokens: {data['max_concurrency']}" in data["summary"]


def test_user_gpu_from_release_yaml(tmp_path: Path) -> None:
    (tmp_path / "release.yaml").write_text("gates:\n  memory:\n    gpu: my-card\n    catalogue:\n"
                                           "      my-card: {memory_gib: 12, price_per_hour: 0.2}\n")
    code, out, _ = plan(MISTRAL, "--gpu", "My Card", "--concurrency", "1", "--context", "512", "--precision",
                        "int4", "--json", project=tmp_path)
    data = json.loads(out)
    assert code == 0 and data["target"]["memory_gib"] == 12 and data["target"]["price_per_hour"] == 0.2


def _package_without_config(tmp_path: Path) -> str:
    pkg = tmp_path / "pkg" / "model"
    pkg.mkdir(parents=True)
    (pkg / "model.onnx").write_bytes(b"")
    return str(tmp_path / "pkg")


def _config_missing_heads(tmp_path: Path) -> str:
    data = json.loads(Path(MISTRAL).read_text())
    del data["num_attention_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(("case", "message", "hint"), [
    ("unknown-gpu", "unknown GPU 'H100-80'", "did you mean 'H100-80GB'?"),
    ("zero-concurrency", "--concurrency: 0 is not a positive integer", "--concurrency of 1 or more"),
    ("negative-context", "--context: -5 is not a positive integer", "--context of 1 or more"),
    ("negative-memory", "memory: -3.0 GiB is not positive", "GPU name or a size"),
    ("no-config", "the package has no config.json", "relctl package"),
    ("missing-field", "config.json: no positive integer 'num_attention_heads'", "needs layers"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str, message: str, hint: str) -> None:
    source, target = MISTRAL, ["--gpu", "H100-80GB"]
    size = ["--concurrency", "8", "--context", "1024"]
    if case == "unknown-gpu":
        target = ["--gpu", "H100-80"]
    elif case == "zero-concurrency":
        size = ["--concurrency", "0", "--context", "1024"]
    elif case == "negative-context":
        size = ["--concurrency", "8", "--context", "-5"]
    elif case == "negative-memory":
        target = ["--memory-gib", "-3"]
    elif case == "no-config":
        source = _package_without_config(tmp_path)
    else:
        source = _config_missing_heads(tmp_path)
    code, out, err = plan(source, *target, *size, project=tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and out == ""
    assert len(lines) == 2 and lines[0].startswith("error: ") and message in lines[0]
    assert lines[1].startswith("hint: ") and hint in lines[1]


def test_a_package_is_planned_from_its_own_initializers(tmp_path: Path, built: dict[str, Path]) -> None:
    from release.backends.package_facts import read_package

    code, out, _ = plan(str(built["int4"]), "--memory-gib", "2", "--provider", "cpu", "--concurrency", "2",
                        "--context", "128", "--json", project=tmp_path)
    data = json.loads(out)
    assert code == 0 and data["model"]["weights_source"] == "package" and data["model"]["precision"] == "int4"
    assert data["breakdown"]["weights"] == read_package(built["int4"]).weights_bytes
    fp32 = next(a for a in data["alternatives"] if a["precision"] == "fp32")
    assert fp32["weights_source"] == "config"  # other precisions: the builder layout from source/config.json


def test_a_tiny_model_shows_its_sizes_in_a_unit_that_shows_them(tmp_path: Path) -> None:
    # A model the size of the tiny example (hundreds of KiB of weights), which "0.00 GiB" hid.
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64,
                                  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 4, "torch_dtype": "float32",
                                  "max_position_embeddings": 128}))
    code, out, _ = plan(str(config), "--memory-gib", "1", "--concurrency", "2", "--context", "64", "--precision",
                        "fp32", project=tmp_path)
    assert code == 0, out
    assert "0.00 GiB" not in out and "0.0 GiB" not in out
    weights = next(line for line in out.splitlines() if line.strip().startswith("weights"))
    assert weights.endswith(" KiB") and float(weights.split()[1]) >= 1
    assert "fp32 at 2 x 64 tokens needs" in out and " MiB, budget 921.60 MiB" in out


def test_size_picks_the_unit_that_shows_the_figure() -> None:
    from release.core.units import size

    assert size(9_000_000) == "8.58 MiB"
    assert size(3 * 2**30) == "3.00 GiB"
    assert size(2048) == "2.00 KiB" and size(512) == "512 B"
    assert size(5 * 2**20, width=9) == "     5.00 MiB"
