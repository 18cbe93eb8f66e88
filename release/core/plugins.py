"""Loading entry-point plug-ins — backends, gates, metrics, detectors: one loader for every group — so that
nothing a plug-in does at import changes a command, and a plug-in is what its entry point says it is.

A plug-in is third-party code that runs when it is imported. Whatever it does there — raise, call
`sys.exit()` (even `sys.exit(0)`: a command must never end "successfully" because a plug-in said so),
print to stdout (which `--json` output owns) — is contained here: the error is returned as one line naming
the entry point, and stdout written during the import goes to stderr. Ctrl-C and SIGTERM still interrupt.
`load_group` loads a whole group so that a broken plug-in does not take the working ones down: each broken one is
kept with its reason, and refused (exit 2) only where release.yaml names it. Every plug-in is a class whose id
attribute (`id` for backends and gates, `name` for metrics and detectors: the key release.yaml and the reports
use) equals its entry-point name, so neither can lie about which code ran.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

from release.core.errors import ConfigError


class PluginBroken(Exception):
    """A plug-in whose import failed; `reason` is one line naming its entry point and its error."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Python-level and fd-level stdout both go to stderr (a plug-in may print, or its C library write)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:   # no fd 1 (a daemon): the Python-level redirect is all there is to do
        saved = -1
    try:
        if saved >= 0:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def load_entry_point(ep: EntryPoint, kind: str) -> object:
    """`ep.load()`, isolated: PluginBroken("<kind> plug-in '<value>' failed to load: ...") for anything the
    import raises, SystemExit included; KeyboardInterrupt (Ctrl-C, relctl's SIGTERM) passes through."""
    try:
        with _stdout_to_stderr():
            return ep.load()
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        raise PluginBroken(f"{kind} plug-in '{ep.value}' failed to load: it called sys.exit({exc.code!r}) "
                           "at import", hint=_reinstall(kind, ep)) from None
    except BaseException as exc:   # any failure of third-party import code is the plug-in's
        first = (str(exc).splitlines() or [""])[0]
        raise PluginBroken(f"{kind} plug-in '{ep.value}' failed to load: {type(exc).__name__}: {first}",
                           hint=_reinstall(kind, ep)) from exc


def _reinstall(kind: str, ep: EntryPoint) -> str:
    return f"fix or reinstall the package that provides {kind} '{ep.name}'"


def group_entry_points(group: str) -> dict[str, EntryPoint]:
    """The installed entry points of `group` by name (nothing imported)."""
    return {ep.name: ep for ep in entry_points(group=group)}


def load_plugin(ep: EntryPoint, kind: str, *, id_attr: str = "id", base: type | None = None) -> type:
    """The class `ep` names, loaded isolated (load_entry_point); PluginBroken when it is not a class (a subclass
    of `base`, when given) or its `id_attr` differs from the entry-point name."""
    obj = load_entry_point(ep, kind)
    if not isinstance(obj, type) or (base is not None and not issubclass(obj, base)):
        what = f"a {base.__module__}.{base.__qualname__} subclass" if base is not None else "a class"
        raise PluginBroken(f"{kind} plug-in '{ep.value}' is not {what}", hint=f"register {what} under {ep.group}")
    if getattr(obj, id_attr, None) != ep.name:
        # The id is the config key and the report label: a mismatch would make both lie.
        raise PluginBroken(f"{kind} plug-in '{ep.value}': {id_attr} {getattr(obj, id_attr, None)!r} differs from "
                           f"its entry-point name '{ep.name}'", hint=f"register the {kind} under its own {id_attr}")
    return obj


@dataclass(frozen=True)
class PluginGroup:
    """One entry-point group, loaded: the classes that load, by name, and why each broken one does not."""

    loaded: dict[str, type] = field(default_factory=dict)
    broken: dict[str, PluginBroken] = field(default_factory=dict)

    def get(self, name: str, where: str) -> type | None:
        """The plug-in `name`; a broken one is an InputError (exit 2) naming `where` and its reason; None when no
        plug-in has that name."""
        if name in self.broken:
            raise ConfigError(f"{where}: {self.broken[name].reason}", hint=self.broken[name].hint)
        return self.loaded.get(name)


def load_group(group: str, kind: str, *, id_attr: str = "id", base: type | None = None) -> PluginGroup:
    """Every plug-in of `group`, each loaded isolated and checked (load_plugin)."""
    loaded: dict[str, type] = {}
    broken: dict[str, PluginBroken] = {}
    for name, ep in group_entry_points(group).items():
        try:
            loaded[name] = load_plugin(ep, kind, id_attr=id_attr, base=base)
        except PluginBroken as exc:
            broken[name] = exc
    return PluginGroup(loaded, broken)
