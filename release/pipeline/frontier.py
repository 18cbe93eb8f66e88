"""The precision frontier: each variant's quality difference from the fp32 reference (with its interval)
against its $/M output tokens, which variants no other beats on both, and why each was not taken.

Rows are read from the engines comparison's rows (duck-typed: engine, precision, cost, rejected, ...) and the
paired verdicts by row label; this module renders, it decides nothing (the dominance it marks is
release/pipeline/ranking.py's, the rule the choice uses).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from release.pipeline.ranking import dominates


def frontier_rows(rows: Sequence[Any], paired: dict[str, dict[str, Any]], chosen: Any) -> list[dict[str, Any]]:
    """One entry per variant, cheapest first (unpriced last): its paired difference per metric, cost,
    whether it is on the frontier (no other passing variant dominates it on cost and paired quality, by the
    rule the choice uses: release/pipeline/ranking.py), the verdict."""
    passing = [r for r in rows if (paired.get(r.label) or {}).get("outcome") == "non_inferior" and r.slo_met
               and r.cost_per_million_tokens is not None]
    out = []
    for row in rows:
        verdict = paired.get(row.label)
        out.append({"engine": row.engine, "precision": row.precision,
                    "paired": None if verdict is None else verdict["outcome"],
                    "metrics": {} if verdict is None else verdict["metrics"],
                    "quality": row.quality, "top1_agreement": row.top1_agreement, "mean_kl": row.mean_kl,
                    "cost_per_million_tokens": row.cost_per_million_tokens, "capped": row.capped,
                    "memory_per_replica_bytes": row.memory_per_replica_bytes,
                    "on_frontier": row in passing and not any(dominates(o, row) for o in passing),
                    "chosen": row is chosen, "why_not": None if row is chosen else row.rejected})
    return sorted(out, key=lambda e: (e["cost_per_million_tokens"] is None, e["cost_per_million_tokens"] or 0.0))


def first_difference(verdict: dict[str, Any]) -> float | None:
    """A paired verdict's quality on one axis: the oriented difference of its first metric (gates.eval.margins
    order), positive is better."""
    metrics = verdict.get("metrics") or {}
    return float(next(iter(metrics.values()))["difference"]) if metrics else None


def frontier_section(search: dict[str, Any] | None) -> list[str]:
    """Markdown for the card, the report's details and the job summary: the frontier table, the int4
    localisation, and the search's cost against the sum of its parts."""
    if not search:
        return []
    lines = ["#### Precision frontier (precision: auto)",
             "Quality is the paired difference from the fp32 reference (candidate - reference, oriented so "
             "that negative is worse) with its interval, against the margin; cost at the SLO. On the frontier: "
             "no other passing variant costs no more (a tie within repeat noise, or both capped at the sweep's "
             "top rate, counts as equal) with paired quality no worse on the first margin metric; the release "
             "is the cheapest of these, a tie going to the better quality, then the smaller memory.", "",
             "| variant | paired eval | difference [interval] (margin) | $ per M output tokens | frontier | "
             "verdict |", "|---|---|---|---|---|---|"]
    for entry in search.get("frontier", []):
        quality = "; ".join(f"{name} {m['difference']:+.4f} [{m['interval'][0]:+.4f}, {m['interval'][1]:+.4f}] "
                            f"({m['margin']:g})" for name, m in entry["metrics"].items()) or "—"
        cost = entry["cost_per_million_tokens"]
        verdict = "**released**" if entry["chosen"] else (entry["why_not"] or "—")
        lines.append(f"| {entry['engine']} {entry['precision']} | {entry['paired'] or 'not run'} | {quality} | "
                     f"{'—' if cost is None else f'{cost:.4g}'} | {'yes' if entry['on_frontier'] else ''} | "
                     f"{verdict.replace('|', '/')} |")
    lines += ["", *sensitivity_lines(search.get("sensitivity"))]
    cost = search.get("cost") or {}
    if cost.get("ratio") is not None:
        every = cost.get("ratio_with_load_tests")
        lines.append(f"- search cost: {cost['wall_s']:.1f} s wall against {cost['builds_s']:.1f} s of builds (with "
                     f"their validations), {cost['evals_s']:.1f} s of evals (the reference scored once among them) "
                     f"and {cost.get('load_tests_s', 0):.1f} s of load tests: "
                     + (f"{every:.2f}x their sum, " if every is not None else "")
                     + f"{cost['ratio']:.2f}x the builds and evals alone")
    return [*lines, ""]


def sensitivity_lines(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []
    if "skipped" in found:
        return [f"- int4 failed and was not localised: {found['skipped']}"]
    ranked = sorted(found.get("added_kl", {}).items(), key=lambda kv: -kv[1])
    line = ("- int4 failed; KL each unit adds over int8 when it alone is int4: "
            + ", ".join(f"{unit} {kl:.3g}" for unit, kl in ranked))
    worst = found.get("worst") or []
    retry = found.get("retry")
    tail = (f"; retried once with {', '.join(worst)} at int8 ({retry})" if worst and retry else
            "; no unit adds KL: nothing to retry")
    return [line + tail]
