"""What a registered name holds: whole models (merged releases) or adapters, never both.

An adapter release writes versions that serve only on a base; a merged release writes whole models. One
into a name that holds the other would turn that model's production into something its servers cannot run
(an adapter where a whole model served, or a whole model where an adapter's base server expects a LoRA),
so either release refuses such a name before any slow stage, nothing written. `relctl check` and `promote`
(both kinds) ask this one rule.
"""

from __future__ import annotations

from release.registry import tags as T
from release.registry.client import Registry

ADAPTER = "adapter"   # relctl.kind on an adapter version
MERGED = "merged"     # a whole model: no relctl.kind tag


def kind_of(tags: dict[str, str]) -> str:
    return ADAPTER if tags.get(T.KIND) == ADAPTER else MERGED


def name_problem(registry: Registry, name: str, kind: str) -> tuple[str, str] | None:
    """(error, hint) when `name` holds versions of the other kind than a `kind` release writes (ADAPTER or
    MERGED); None for a new name or one of the same kind. One search of the name's versions."""
    if not registry.model_exists(name):
        return None
    other = [v for v, tags in sorted(registry.version_tags(name).items(), key=lambda kv: int(kv[0]))
             if kind_of(tags) != kind]
    if not other:
        return None
    listed = ", ".join(f"v{v}" for v in other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
    if kind == ADAPTER:
        return (f"{name} is a whole model's registered name ({listed}): an adapter release never writes into it "
                "(its production would become an adapter its servers cannot run)",
                "give the adapter its own registered model: --model ADAPTER_NAME (release.mode adapter: "
                "release.yaml's model), or leave it out (BASE-EXPERIMENT); `relctl status` lists the names")
    return (f"{name} is an adapter's registered name ({listed}): a merged release never writes a whole model "
            "into it (its production would stop being an adapter of its base)",
            "name the whole model with --model NAME (or release.yaml's model:), or release the run's adapter "
            f"onto its base: relctl promote RUN --onto BASE@production --model {name}")
