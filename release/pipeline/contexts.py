"""Every context release.yaml sets, checked against the model's maximum before anything slow.

A context is a number of tokens one sequence holds. A plan, a load test or a gate at a context the model
cannot attend to measures nothing real (and an engine may refuse to start beyond its maximum, minutes into a
promote), so `relctl check` and promote's first step refuse it, naming the setting to change. The fields are
found by name, in release.yaml's own sections and in every configured gate's block, so a new gate's
`context` is checked without a line here:

- a whole sequence (`context`, `context_tokens`): at most the model's maximum;
- a part of one (`prefill_tokens`, `output_tokens`, `max_new_tokens`): below it, leaving room for the rest.

In release.yaml's own sections only values the file sets to something other than the default are checked
(a default such as serving.context_tokens: 512, which `relctl init`'s template writes out, is a planning figure
the user never chose; the memory stage plans at the model's maximum instead); in a configured gate every value
is in effect, defaults included, because the gate runs with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from release.config import ReleaseConfig
from release.gating.contract import Gate, Problem

# config.json keys that give a model's maximum positions, by family (Llama/Qwen/..., GPT-2, others).
MAX_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
SEQUENCE_FIELDS = frozenset({"context", "context_tokens"})
PART_FIELDS = frozenset({"prefill_tokens", "output_tokens", "max_new_tokens"})


def model_max_context(config: dict[str, Any]) -> tuple[str, int] | None:
    """(config.json key, value) of the model's maximum context, or None when config.json states none."""
    for key in MAX_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def context_problems(cfg: ReleaseConfig, gates: list[Gate], config: dict[str, Any]) -> list[Problem]:
    """One problem per context setting beyond what the model takes, each naming the setting to change."""
    limit = model_max_context(config)
    if limit is None:
        return []
    key, maximum = limit
    found = list(_contexts(cfg, "", explicit_only=True))
    for gate in gates:
        block = getattr(gate, "config", None)
        if isinstance(block, BaseModel):
            found += _contexts(block, f"gates.{gate.id}.", explicit_only=False)
    problems = []
    for path, name, value in found:
        whole = name in SEQUENCE_FIELDS
        if value <= maximum if whole else value < maximum:
            continue
        bound = f"{maximum} or less" if whole else f"below {maximum} (a prompt needs room too)"
        problems.append(Problem(f"release.yaml: {path}: {value} tokens is beyond the model's maximum context "
                                f"({key} {maximum} in config.json)", f"set {path} to {bound}"))
    return problems


def _contexts(model: BaseModel, prefix: str, explicit_only: bool) -> Iterator[tuple[str, str, int]]:
    """(dotted path, field name, value) of every context field under `model`."""
    for name in type(model).model_fields:
        if explicit_only and name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from _contexts(value, f"{path}.", explicit_only)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _contexts(item, f"{path}[{i}].", explicit_only)
        elif (name in SEQUENCE_FIELDS or name in PART_FIELDS) and isinstance(value, int) \
                and not isinstance(value, bool):
            if explicit_only and value == type(model).model_fields[name].default:
                continue  # the default written out (relctl init's template writes every field): nobody chose it
            yield path, name, value
