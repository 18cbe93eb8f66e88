"""Finding, configuring and running gates.

Gates are found through the `relctl.gates` entry-point group; relctl's own gates register there the
same way a third-party package would:

    [project.entry-points."relctl.gates"]
    toxicity = "mypkg.gates:ToxicityGate"
"""

from __future__ import annotations

import difflib
import traceback
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint
from typing import Any

from pydantic import ValidationError

from release.core.errors import ConfigError, InputError
from release.core.plugins import PluginBroken, group_entry_points, load_plugin
from release.gating.contract import Gate, GateContext, GateResult

ENTRY_POINT_GROUP = "relctl.gates"


def available_gates() -> dict[str, type[Gate]]:
    """Every installed gate class by id (built-ins included)."""
    return {name: _load(ep) for name, ep in _gate_entry_points().items()}


def _gate_entry_points() -> dict[str, EntryPoint]:
    return group_entry_points(ENTRY_POINT_GROUP)


def _load(ep: EntryPoint) -> type[Gate]:
    try:   # the one plug-in loader: nothing it does at import ends or changes the command; its id is its name
        cls: type[Gate] = load_plugin(ep, "gate")
    except PluginBroken as exc:
        raise ConfigError(exc.reason, hint=exc.hint) from exc
    return cls


def load_gates(block: Mapping[str, Mapping[str, Any] | None], file: str = "release.yaml") -> list[Gate]:
    """One configured gate per `gates.<id>` entry, in release.yaml order.

    Unknown ids and invalid keys are ConfigErrors naming `<file>: gates.<id>.<key>` (`file`: the config file's
    name, a -c file's own); an empty block (`eval:` with nothing under it) means the gate's defaults.
    """
    gates: list[Gate] = []
    for gate_id, settings in block.items():
        cls = find_gate(gate_id, file)
        gates.append(cls(validate_block(cls, settings or {}, file)))  # type: ignore[call-arg]
    return gates


def validate_block(cls: type[Gate], settings: Mapping[str, Any], file: str = "release.yaml") -> Any:
    """The gate's Config for `settings`, or a ConfigError naming the first bad key."""
    try:
        return cls.Config.model_validate(dict(settings))
    except ValidationError as exc:
        raise _block_error(cls, exc, file) from exc


def _block_error(cls: type[Gate], exc: ValidationError, file: str) -> ConfigError:
    err = exc.errors()[0]
    where = ".".join(["gates", cls.id, *(str(p) for p in err["loc"])])
    if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
        close = difflib.get_close_matches(str(err["loc"][-1]), list(cls.Config.model_fields), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(cls.Config.model_fields)}"
        return ConfigError(f"{file}: unknown key '{where}'", hint=hint)
    if err["type"] == "extra_forbidden":
        return ConfigError(f"{file}: unknown key '{where}'",
                           hint=f"see the gates.{cls.id} section of templates/release.yaml")
    return ConfigError(f"{file}: {where}: {err['msg']}",
                       hint=f"see the gates.{cls.id} section of templates/release.yaml")


def _unknown_gate(gate_id: str, known: list[str], file: str) -> ConfigError:
    close = difflib.get_close_matches(gate_id, known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"installed gates: {', '.join(sorted(known)) or 'none'}"
    return ConfigError(f"{file}: unknown gate 'gates.{gate_id}'", hint=hint)


def find_gate(gate_id: str, file: str = "release.yaml") -> type[Gate]:
    """The installed gate class for `gate_id` (only that plug-in is imported); ConfigError when unknown."""
    known = _gate_entry_points()
    if gate_id not in known:
        raise _unknown_gate(gate_id, list(known), file)
    return _load(known[gate_id])


def run_gates(gates: list[Gate], context_factory: Callable[[str], GateContext]) -> list[GateResult]:
    """Run `gates` in order, each with `context_factory(gate_id)`; a gate that crashes is a failed gate.

    Every gate runs even after one fails, so the report shows all the evidence at once. InputError (bad
    data or config, exit 2) propagates: it is the user's to fix, not a verdict on the model.
    """
    return [run_gate(gate, context_factory(gate.id)) for gate in gates]


def run_gate(gate: Gate, context: GateContext) -> GateResult:
    """One gate; an unexpected exception becomes a failure whose traceback is kept as evidence."""
    context.work_dir.mkdir(parents=True, exist_ok=True)
    try:
        return gate.run(context)
    except InputError:
        raise
    except Exception as exc:  # a crashing gate must block the release, not abort it
        trace = context.work_dir / "traceback.txt"
        trace.write_text(traceback.format_exc())
        first_line = (str(exc).splitlines() or [""])[0]
        return GateResult(gate=gate.id, status="fail", reason=f"gate crashed: {type(exc).__name__}: {first_line}",
                          evidence=[trace])
