"""precision: auto's pieces (issue 29, steps 4 and 5), without a promote: the installed builder's quantizer
options read from its source (old and new option names), the variants the backend offers on this device,
the frontier's dominance, and int4 localised by real per-unit builds of the example's model, whose retry
puts exactly the worst units' MatMuls at int8.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from release.backends import get_backend
from release.backends.onnxruntime_genai.quantizers import (
    installed_options,
    parse_options,
    unit_prefix,
    variant_problem,
)
from release.backends.variants import parse_variant
from release.config import EngineConfig, ValidationConfig
from release.core.checkpoint import read_config
from release.core.progress import Progress
from release.pipeline.engines import EngineBuild, EngineRow
from release.pipeline.frontier import frontier_rows, frontier_section, sensitivity_lines
from release.pipeline.precision_search import localise, worst_units
from release.stages.convert import convert
from release.stages.merge import merge_checkpoint
from release.stages.validate import load_prompts, validate

NEW_HELP = """
                algo_config = Base method for int4/int8 weight-only quantization. Default is 'default'.
                    Currently supported base methods are: 'default', 'rtn', 'k_quant'.
                matmul_mixed_precision = Quantize selected MatMul groups with a different quant type.
                    Selectors:
                    - last_matmul = the last MatMul
                    - mixed_layers = the most quantization-sensitive MatMuls
                    Quant types:
                    - 'int4'
"""
# The builder before the rename: int4_-prefixed names, compound methods, no placement option.
OLD_HELP = """
                int4_algo_config = Specify the INT4 quantization algorithm to use.
                    Currently supported methods are: 'default', 'rtn', 'k_quant_mixed', 'k_quant_last'.
"""


def test_option_names_are_read_from_the_builder_not_assumed() -> None:
    new, old = parse_options(NEW_HELP), parse_options(OLD_HELP)
    assert (new.algo_option, new.methods) == ("algo_config", ("default", "rtn", "k_quant"))
    assert new.placements == ("last_matmul", "mixed_layers")
    assert [v.name for v in new.int4_variants()] == ["int4+algo=rtn", "int4+algo=k_quant",
                                                     "int4+mixed=last_matmul:int8", "int4+mixed=mixed_layers:int8"]
    assert (old.algo_option, old.mixed_option) == ("int4_algo_config", None)
    assert [v.name for v in old.int4_variants()] == ["int4+algo=rtn", "int4+algo=k_quant_mixed",
                                                     "int4+algo=k_quant_last"]
    assert variant_problem(parse_variant("int4+mixed=last_matmul:int8"), old) is not None  # not in that builder
    assert parse_options("") .int4_variants() == []  # a builder that lists nothing: the default int4 only


def test_the_backend_offers_what_the_installed_builder_and_the_device_take() -> None:
    backend = get_backend("onnxruntime-genai")
    offered = backend.precision_variants({}, "cpu")
    assert offered[:3] == ["fp32", "int8", "int4"] and "fp16" not in offered  # fp16 graphs crash on the CPU EP
    installed = installed_options()
    for method in installed.methods:
        assert method == "default" or f"int4+algo={method}" in offered
    assert backend.target_problem("int4+algo=nope", "cpu") is not None
    assert backend.target_problem("int4+int8=layers.0,lm_head", "cpu") is None
    assert backend.target_problem("fp32+algo=rtn", "cpu") is not None  # options quantize: int4/int8 only
    assert unit_prefix("layers.2", layers=2) is None and unit_prefix("lm_head") == "/lm_head/"


def test_worst_units_hold_most_of_the_added_kl() -> None:
    assert worst_units({"layers.0": 0.001, "layers.1": 0.02, "lm_head": 0.004}) == ["layers.1"]
    assert worst_units({"layers.0": 0.01, "layers.1": 0.01, "layers.2": 0.01, "lm_head": 0.0}) == \
        ["layers.0", "layers.1"]  # at most half the units
    assert worst_units({"layers.0": 0.0}) == []


def _row(precision: str, cost: float | None, rejected: str | None = None, quality: float | None = None) -> EngineRow:
    """A row as the pipeline leaves it: priced rows met the SLOs; under auto, quality is the paired difference."""
    return EngineRow("onnxruntime-genai", precision, quality_passed=rejected is None, slo_met=cost is not None,
                     cost_per_million_tokens=cost, rejected=rejected, quality=quality)


def _paired(difference: float, outcome: str = "non_inferior") -> dict[str, Any]:
    return {"outcome": outcome, "metrics": {"token_accuracy": {
        "difference": difference, "interval": [difference - 0.01, difference + 0.01], "margin": 0.05}}}


def test_the_frontier_keeps_variants_no_other_beats_on_cost_and_quality() -> None:
    rows = [_row("fp32", 3.0, "dearer", 0.0), _row("int8", 2.0, None, -0.001), _row("int4", 1.0, "dearer", -0.02),
            _row("int4+algo=rtn", 1.5, "dearer", -0.03), _row("int4+algo=k_quant", None, "quality: paired eval")]
    paired = {"onnxruntime-genai fp32": _paired(0.0), "onnxruntime-genai int8": _paired(-0.001),
              "onnxruntime-genai int4": _paired(-0.02), "onnxruntime-genai int4+algo=rtn": _paired(-0.03),
              "onnxruntime-genai int4+algo=k_quant": _paired(-0.2, "inferior")}
    found = frontier_rows(rows, paired, rows[1])
    by = {e["precision"]: e for e in found}
    assert [e["precision"] for e in found][:4] == ["int4", "int4+algo=rtn", "int8", "fp32"]  # cheapest first
    assert {p for p, e in by.items() if e["on_frontier"]} == {"int4", "int8", "fp32"}  # rtn: int4 beats it
    assert by["int8"]["chosen"] and by["int4+algo=k_quant"]["why_not"] == "quality: paired eval"
    text = "\n".join(frontier_section({"frontier": found, "cost": {"wall_s": 10, "builds_s": 6, "evals_s": 3,
                                                                 "load_tests_s": 1, "ratio": 1.11,
                                                                 "ratio_with_load_tests": 1.0}}))
    assert "| onnxruntime-genai int4 | non_inferior | token_accuracy -0.0200 [-0.0300, -0.0100] (0.05)" in text
    assert "**released**" in text and "1.00x their sum, 1.11x the builds and evals alone" in text


@pytest.fixture(scope="module")
def unit_builds(tiny_checkpoint: Path, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Real builds of the example's model: each unit alone at int4 (the rest int8), then the retry."""
    out = tmp_path_factory.mktemp("units")
    merged = out / "merged"
    merge_checkpoint(tiny_checkpoint, tiny_checkpoint, merged)
    backend = get_backend("onnxruntime-genai")
    prompts = load_prompts(tiny_data / "validation" / "prompts.jsonl")[:6]
    built: dict[str, Path] = {}

    def build(entry: EngineConfig) -> EngineBuild:
        folder = out / entry.precision.replace("+", "_").replace("=", "-").replace(",", "-")
        convert(merged, folder, entry.precision, backend=entry.backend)
        built[entry.precision] = folder
        result = validate(merged, folder, prompts, merged / "tokenizer.json",
                          ValidationConfig(max_new_tokens=4), backend)
        return EngineBuild(result.model_dump(mode="json"))

    # The int8 row as the search measured it; its KL (about 1e-5 on this model) is taken as 0 here, one build
    # fewer: the units' added KL is then their own KL.
    rows = [EngineRow("onnxruntime-genai", "int8", quality_passed=True, mean_kl=0.0),
            EngineRow("onnxruntime-genai", "int4", quality_passed=False, rejected="quality: mean KL")]
    found = localise(rows, read_config(tiny_checkpoint), build, Progress(quiet=True))
    retry = found.get("retry")
    if retry is not None:
        build(retry)
    return {"found": found, "built": built}


def _bits(folder: Path) -> dict[str, int]:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return {n.name: next(a.i for a in n.attribute if a.name == "bits")
            for n in model.graph.node if n.op_type == "MatMulNBits"}


def test_int4_is_localised_per_unit_and_retried_with_the_worst_at_int8(unit_builds: dict[str, Any],
                                                                         tiny_checkpoint: Path) -> None:
    found, built = unit_builds["found"], unit_builds["built"]
    layers = read_config(tiny_checkpoint)["num_hidden_layers"]
    assert set(found["added_kl"]) == {*(f"layers.{i}" for i in range(layers)), "lm_head"}
    assert all(v >= 0 for v in found["added_kl"].values())
    # Each sensitivity build really has that one unit at int4 and everything else at int8.
    for unit in found["added_kl"]:
        bits = _bits(built[f"int4+int4_only={unit}"])
        prefix = str(unit_prefix(unit))
        assert bits and all((b == 4) == n.startswith(prefix) for n, b in bits.items()), (unit, bits)
    worst = found["worst"]
    assert worst and found["worst"] == worst_units(found["added_kl"])
    assert found["retry"].precision == "int4+int8=" + ",".join(worst)
    bits = _bits(built[found["retry"].precision])
    prefixes = tuple(str(unit_prefix(u)) for u in worst)
    assert all((b == 8) == n.startswith(prefixes) for n, b in bits.items()), bits
    assert any(b == 4 for b in bits.values())  # the rest of the body stays int4
    # The card names the units (frontier_section renders the report's sensitivity block).
    line = sensitivity_lines({**found, "retry": found["retry"].precision})[0]
    assert all(unit in line for unit in found["added_kl"]) and f"retried once with {', '.join(worst)}" in line
