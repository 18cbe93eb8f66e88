"""The quantizer options the INSTALLED model builder accepts, read from its own source (its --extra_options
help text), never assumed: onnxruntime-genai renamed `int4_algo_config` to `algo_config` and added
`matmul_mixed_precision`, and a later release removes the old names. The source is read as text (importing
the builder loads torch and transformers; `precision: auto` asks for this at `relctl check` time).

What `precision: auto` builds at int4 on top of the default build: each base method the builder lists
(`algo=`), and each int8 placement it lists (`mixed=`: the last MatMul, the llama.cpp mixed layers).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from release.backends.variants import Variant

# The placements that put MatMuls of an int4 body at int8 (a selector for another model type, such as
# linear_attn for hybrid attention, changes nothing on the families this backend releases).
INT8_PLACEMENTS = ("last_matmul", "mixed_layers")


@dataclass(frozen=True)
class BuilderOptions:
    """Option names and values found in the installed builder's help text (empty when it lists none)."""

    algo_option: str | None             # "algo_config" (or the old "int4_algo_config")
    methods: tuple[str, ...]            # base methods: "default", "rtn", "k_quant", ...
    mixed_option: str | None            # "matmul_mixed_precision" when the builder has it
    placements: tuple[str, ...]         # selectors of that option: "last_matmul", "mixed_layers", ...

    def int4_variants(self) -> list[Variant]:
        """The int4 builds beside the default one: each other base method, each int8 placement."""
        found = [Variant("int4", (("algo", m),)) for m in self.methods if m != "default"]
        found += [Variant("int4", (("mixed", f"{p}:int8"),)) for p in INT8_PLACEMENTS if p in self.placements]
        return found


def builder_source() -> str:
    spec = importlib.util.find_spec("onnxruntime_genai.models.builder")
    if spec is None or spec.origin is None:
        return ""
    return Path(spec.origin).read_text(errors="replace")


@functools.cache
def installed_options() -> BuilderOptions:
    return parse_options(builder_source())


def parse_options(source: str) -> BuilderOptions:
    """The option names in the builder's `--extra_options` help text (see the module docstring)."""
    algo = next((name for name in ("algo_config", "int4_algo_config")
                 if re.search(rf"^\s*{name} = ", source, re.MULTILINE)), None)
    methods: tuple[str, ...] = ()
    if algo is not None:
        listed = re.search(r"supported (?:base )?methods are: ([^\n]*)", source)
        methods = tuple(re.findall(r"'([a-z_0-9]+)'", listed.group(1))) if listed else ()
    mixed = "matmul_mixed_precision" if re.search(r"^\s*matmul_mixed_precision = ", source, re.MULTILINE) else None
    placements: tuple[str, ...] = ()
    if mixed is not None:
        block = source.split("matmul_mixed_precision = ", 1)[1].split("Quant types:", 1)[0]
        placements = tuple(re.findall(r"^\s*- ([a-z_]+) = ", block, re.MULTILINE))
    return BuilderOptions(algo, methods, mixed, placements)


def variant_problem(variant: Variant, options: BuilderOptions, layers: int | None = None) -> str | None:
    """Why the installed builder cannot build `variant`, or None."""
    for key, value in variant.options:
        if variant.precision not in ("int4", "int8"):
            return f"option {key}={value} applies to int4/int8 builds only"
        if key == "algo":
            if options.algo_option is None or value not in options.methods:
                return (f"the installed model builder has no quantization method '{value}' (it lists: "
                        f"{', '.join(options.methods) or 'none'})")
        elif key == "mixed":
            for pair in value.split(","):
                selector, _, quant_type = pair.partition(":")
                if options.mixed_option is None or selector not in options.placements or quant_type not in (
                        "int4", "int8"):
                    return (f"the installed model builder has no mixed placement '{pair}' (it lists: "
                            f"{', '.join(options.placements) or 'none'}, at int4/int8)")
        elif key in ("int8", "int4_only"):
            for unit in value.split(","):
                if unit_prefix(unit, layers) is None:
                    return f"'{unit}' is not a unit of this model (layers.<i> or lm_head)"
        else:
            return f"unknown build option '{key}' (algo, mixed, int8, int4_only)"
    return None


def unit_prefix(unit: str, layers: int | None = None) -> str | None:
    """The builder's node-name prefix of one unit: `layers.3` -> `/model/layers.3/`, `lm_head` -> `/lm_head/`."""
    if unit == "lm_head":
        return "/lm_head/"
    match = re.fullmatch(r"layers\.(\d+)", unit)
    if match is None or (layers is not None and int(match.group(1)) >= layers):
        return None
    return f"/model/{unit}/"


def builder_arguments(variant: Variant, options: BuilderOptions) -> list[str]:
    """Command-line arguments for build_process: the builder's own --extra_options, and relctl's per-unit
    int8 placements (build_process applies those to the graph, see there)."""
    extra: list[str] = []
    algo, mixed = variant.option("algo"), variant.option("mixed")
    if algo is not None and options.algo_option is not None:
        extra.append(f"{options.algo_option}={algo}")
    if mixed is not None and options.mixed_option is not None:
        extra.append(f"{options.mixed_option}={mixed}")
    args = ["--extra_options", *extra] if extra else []
    for key, flag in (("int8", "--relctl_int8_units"), ("int4_only", "--relctl_int4_only_units")):
        value = variant.option(key)
        if value is not None:
            args += [flag, ",".join(str(unit_prefix(u)) for u in value.split(","))]
    return args
