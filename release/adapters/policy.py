"""What of release.yaml an adapter release honours, and what it refuses rather than skip in silence.

An adapter release runs the base match, the adapter's validation against the merged fp32 reference,
with `--server`, `gates.canary` on the running base, and waits for `relctl approve` under `require_approval`
(docs/adapters.md). It does not run the other gates, wait for an approval after a canary, or compare
engines. A release.yaml that asks for any of those would otherwise ship the adapter without them, so each
is refused (exit 2, one line each) before the registry is opened: a control a team configured is never
skipped because the run took the adapter path.
"""

from __future__ import annotations

from release.config import ReleaseConfig

ADAPTER_GATES = frozenset({"canary"})  # the gates an adapter release runs (release/adapters/canary.py)
HINT = ("release the run merged to run them (relctl promote RUN, without --onto), or give adapter releases "
        "their own release.yaml without them (docs/adapters.md)")


def unsupported(cfg: ReleaseConfig) -> list[tuple[str, str]]:
    """(problem, hint) for each part of `cfg` an adapter release would not carry out."""
    problems: list[tuple[str, str]] = []
    gates = sorted(set(cfg.gates) - ADAPTER_GATES)
    if gates:
        named = ", ".join(f"gates.{g}" for g in gates)
        problems.append((f"{named}: not run by an adapter release (only gates.canary, on the running base); "
                         "the adapter would ship without them", HINT))
    missing = sorted(set(cfg.require) - set(cfg.gates))  # (as relctl check says for a merged release)
    if missing:
        problems.append((f"release.yaml: require lists {', '.join(missing)}, which gates: does not configure",
                         f"add a gates.{missing[0]} block, or remove it from require"))
    if cfg.require_approval and "canary" in cfg.gates:  # the adapter canary's pass moves production itself
        problems.append(("require_approval with gates.canary: an adapter's canary moves production when it passes, "
                         "so the approval would be skipped", "drop gates.canary for adapter releases that need an "
                         "approval (the approval is the check), or drop require_approval (docs/adapters.md)"))
    if cfg.engines:
        problems.append(("engines: an adapter serves on its base's engine, there is nothing to compare",
                         "drop engines from the adapter's release.yaml"))
    return problems
