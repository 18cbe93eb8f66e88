"""release.yaml written from the schema itself: every key, its default and a comment saying what it is.

`relctl init` writes this text, so a starter file can never drift from what `load_config` accepts: the
keys are release.config.ReleaseConfig's fields and each installed gate's Config, the values their
defaults. Gate blocks are written commented out (a configured gate runs); uncommenting one gives that
gate's defaults.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from release import __version__
from release.config import ReleaseConfig
from release.gating.plugins import available_gates

# Cheap gates first, so a release that fails evaluation does not wait for a load test.
GATE_ORDER = ("eval", "safety", "load", "canary")
GATES_FIELD = "gates"

_NAMES: dict[Any, str] = {str: "text", int: "integer", float: "number", bool: "true/false", Path: "path",
                          Any: "any value"}
_BOUNDS = ((at.Ge, ">="), (at.Gt, ">"), (at.Le, "<="), (at.Lt, "<"))


def release_yaml_text(gates: dict[str, type[BaseModel]] | None = None) -> str:
    """The whole starter release.yaml. `gates`: gate id -> its Config class (default: the installed gates)."""
    if gates is None:
        gates = {gate_id: cls.Config for gate_id, cls in available_gates().items()}
    lines = [
        f"# release.yaml for relctl {__version__}, written by `relctl init` from relctl's schema: every key is",
        "# optional and shows its default. Unknown keys are refused with a did-you-mean hint.",
        "",
    ]
    defaults = ReleaseConfig()
    # The gates example is the file's commented-out tail, whatever the schema's field order.
    fields = sorted(ReleaseConfig.model_fields.items(), key=lambda item: item[0] == GATES_FIELD)
    for name, field in fields:
        if name == GATES_FIELD and get_origin(field.annotation) is dict:
            lines += _gates_lines(field, gates)
        else:
            lines += _field_lines(name, field, defaults, 0)
        if name == "convert":
            lines += _engine_block_lines()
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _engine_block_lines() -> list[str]:
    """Each installed backend's own `convert.<id>` block (its `settings_model`), commented out."""
    from release.backends import available_backends  # noqa: PLC0415 - entry points, only when writing the file

    lines: list[str] = []
    for backend in available_backends().values():
        model = backend.settings_model
        if model is None:
            continue
        block = [f"# the {backend.id} backend's own settings, checked when the file is read", f"{backend.id}:",
                 *_model_lines(model, model(), 1)]
        lines += [f"  #   {line}" for line in block]
    return lines


def ordered_gate_ids(gate_ids: list[str]) -> list[str]:
    """Built-in gates in pipeline order, then the rest by name."""
    known = [g for g in GATE_ORDER if g in gate_ids]
    return known + sorted(g for g in gate_ids if g not in GATE_ORDER)


def _gates_lines(field: FieldInfo, gates: dict[str, type[BaseModel]]) -> list[str]:
    lines = [
        "# Gates run in this order after packaging, before anything is registered. Uncomment a gate's block",
        "# to enable it (an empty block, e.g. `safety: {}`, means its defaults); each key shows its default.",
        f"{GATES_FIELD}: {{}}",
    ]
    block = [f"{GATES_FIELD}:"]
    for gate_id in ordered_gate_ids(list(gates)):
        config = gates[gate_id]
        block.append(f"  # gate '{gate_id}'" + (f": {_first_line(config.__doc__)}" if config.__doc__ else ""))
        block.append(f"  {gate_id}:")
        try:
            defaults = config()
        except ValidationError as exc:
            # A gate whose defaults alone are not a valid block (e.g. it needs one of two keys): say what.
            block.append(f"    # needs settings: {_first_line(exc.errors()[0]['msg'].removeprefix('Value error, '))}")
            defaults = config.model_construct()
        block += _model_lines(config, defaults, 2)
    return lines + [f"# {line}" if line else "#" for line in block]


def _model_lines(model: type[BaseModel], instance: BaseModel, depth: int) -> list[str]:
    lines: list[str] = []
    for name, field in model.model_fields.items():
        lines += _field_lines(name, field, instance, depth)
    return lines


def _field_lines(name: str, field: FieldInfo, instance: BaseModel, depth: int) -> list[str]:
    pad = "  " * depth
    lines = [f"{pad}# {_describe(field)}"]
    if field.is_required() and name not in instance.model_fields_set:
        return [*lines, f"{pad}{name}:  # required, no default"]
    value = getattr(instance, name)
    if isinstance(value, BaseModel):
        return [*lines, f"{pad}{name}:", *_model_lines(type(value), value, depth + 1)]
    dumped = instance.model_dump(mode="json")[name]
    lines.append(f"{pad}{name}: {_scalar(dumped)}")
    section = _models_in(field.annotation)
    if value is None and section is not None:
        # An optional section that is off by default: its keys, commented, for when it is set.
        sub = [f"{name}:", *_model_lines(section, section(), 1)]
        lines += [f"{pad}#   {line}" for line in sub]
    return lines


def _describe(field: FieldInfo) -> str:
    kind = _type_text(field.annotation) + _bounds(field.metadata)
    return f"{field.description} [{kind}]" if field.description else f"[{kind}]"


def _type_text(ann: Any) -> str:
    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin is Annotated:
        extra = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return _type_text(args[0]) + _bounds(extra)
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        text = " or ".join(_type_text(a) for a in present)
        return text + (" or null" if len(present) < len(args) else "")
    if origin is list:
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        value = args[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return f"map of name -> {{{', '.join(value.model_fields)}}}"
        return f"map of name -> {_type_text(value)}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return _NAMES.get(ann, getattr(ann, "__name__", str(ann)))


def _bounds(metadata: list[Any]) -> str:
    parts = [f"{op} {getattr(m, attr)}" for m in metadata for kind, op in _BOUNDS if isinstance(m, kind)
             for attr in (kind.__name__.lower(),)]
    return f", {' and '.join(parts)}" if parts else ""


def _models_in(ann: Any) -> type[BaseModel] | None:
    """The pydantic model of `ann` when it is one, or an optional one."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _scalar(value: Any) -> str:
    text = str(yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)).strip()
    return text.removesuffix("...").strip()


def _first_line(doc: str) -> str:
    return doc.strip().splitlines()[0].rstrip(".")
