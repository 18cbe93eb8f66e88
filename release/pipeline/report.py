"""The release report (JSON, every number) and the model card (markdown, the version's description)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from release.core.errors import EXIT_BLOCKED, EXIT_RELEASED
from release.core.escape import job_summary, markdown
from release.core.package import LEGACY_BACKEND
from release.core.units import size
from release.pipeline.engines import engines_section
from release.registry import tags as T

# report.links labels the card builds sentences from
RELEASE_RUN_LINK, TRAINING_RUN_LINK, VERSION_LINK = "release run", "training run", "version"
REPLACED, COMPARED = "production it replaced", "production it was compared with"
PLOT_LINK = "plot: "
REPORT_LINK = "the release report (report.html)"
REPORT_ARTIFACT = "report/report.html"
METRICS_LINK = "every number (the version's logged model)"


@dataclass
class ReleaseReport:
    model: str
    training_run: str
    release_run: str | None
    precision: str
    outcome: str = "running"          # released | blocked | error
    exit_code: int = EXIT_RELEASED
    version: str | None = None
    aliases: dict[str, list[str | None]] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    validation: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    gates: list[dict[str, Any]] = field(default_factory=list)
    lineage: dict[str, Any] = field(default_factory=dict)
    package: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    schema_version: int = 3
    model_uri: str | None = None                  # models:/NAME/VERSION once a version exists
    links: dict[str, str] = field(default_factory=dict)   # MLflow UI: version, release run, training run
    # The production version the release was compared with: {"version", "metrics"} (its recorded numbers).
    production: dict[str, Any] | None = None
    plots: dict[str, str] = field(default_factory=dict)   # title -> artifact path in the release run
    # A re-gate: every release run of the version, oldest first (the first registered and holds the package).
    release_runs: list[str] = field(default_factory=list)
    # engines: side by side (release/pipeline/engines.py): the plan, one row per engine, the choice and why.
    engines: dict[str, Any] | None = None
    # The engine that builds and serves the release: {"backend", "precision", "why"} (auto's choice named).
    engine: dict[str, Any] | None = None
    # The fp32 reference's scorings on the eval set and their reuses (release/gating/reference.py's `usage`):
    # {"scorings", "reused", "seconds", "uses"}; scored once per release.
    reference_scoring: dict[str, Any] | None = None

    def block(self, failures: list[str]) -> None:
        self.outcome, self.exit_code = "blocked", EXIT_BLOCKED
        self.failures.extend(failures)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def _sig(value: Any) -> str:
    """A figure as a reviewer reads it: three significant digits (0.992, not 0.99209237098693848), whole
    numbers from 100 up (2346 ms, not 2.35e+03)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—" if value is None else str(value)
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _commit(commit: Any, dirty: Any) -> str:
    if not commit:
        return "not recorded (not a git repository)"
    state = {"true": "uncommitted changes", "false": "clean", True: "uncommitted changes", False: "clean"}
    return f"`{commit}` ({state.get(dirty, 'state unknown')})"


VERDICT = {"released": "Released", "re-gated": "Re-gated", "blocked": "Blocked", "dry-run": "Dry run passed",
           "error": "Failed", "unchanged": "Unchanged"}
DETAILS_ARTIFACT = "report/details.md"   # every figure behind the card, in the release run
DETAILS_LINK = "every figure (details)"
MAX_FIGURES = 3                          # deciding figures per row; the rest are in the details


def engine_line(report: ReleaseReport) -> str:
    """The engine and precision the release serves on, and why that engine (the card's first fact)."""
    engine = report.engine or {}
    backend = engine.get("backend") or report.package.get("backend")
    if not backend:
        return ""
    why = f" ({engine['why']})" if engine.get("why") else ""
    return f"Serves on **{backend}** at **{report.precision}**{why}."


def _engine_name(report: ReleaseReport) -> str:
    """What the card's title calls a package: its backend's display name (older reports name none: the
    backend of format-1 packages), or its id when that backend is not installed here."""
    from release.backends import available_backends  # noqa: PLC0415 - entry points, only for a card

    backend = str(report.package.get("backend") or LEGACY_BACKEND)
    found = available_backends().get(backend)
    return found.display_name or backend if found is not None else backend


def model_card(report: ReleaseReport, extra_sections: list[str] | None = None, plot_links: bool = True) -> str:
    """Markdown shown as the registered version's description in the MLflow UI: the verdict and the few
    figures that decide it (validation, each gate's deciding numbers, memory fit, cost), one line per extra
    section, then the plots, lineage and links. Every other figure is in the details artifact it links.
    `plot_links` False: no list of the plots (report.html shows them inline instead)."""
    links = report.links
    backend = (report.engine or {}).get("backend") or report.package.get("backend")
    title = f"# {report.model} — {backend} {report.precision}" if backend else f"# {report.model} — {report.precision}"
    lines = [title, "",
             f"**{VERDICT.get(report.outcome, report.outcome)}**: {verdict_sentence(report)}{_against(report)}", "",
             *([engine_line(report), ""] if engine_line(report) else []), _provenance(report), ""]
    lines += decision_table(report)
    scoring = reference_line(report)
    if scoring:
        lines += [scoring, ""]
    for section in extra_sections or []:
        lines += [section, ""]
    details = _link(DETAILS_ARTIFACT, links.get(DETAILS_LINK))
    lines += [f"Every figure behind these (validation metrics, the memory plan, each gate's metrics and load "
              f"rows): {details} in the release run."
              + (f" Every number is also a metric of the version's [logged model]({links[METRICS_LINK]})."
                 if METRICS_LINK in links else ""), ""]
    if report.failures:
        lines += ["## Why it was blocked", *(f"- {markdown(f)}" for f in report.failures), ""]
    if report.notes:
        lines += ["## Notes", *(f"- {markdown(n)}" for n in report.notes), ""]
    if report.plots and plot_links:
        lines += ["## Plots", *(f"- {_link(title, links.get(PLOT_LINK + title), code=False)}"
                                f" (release run artifact `{path}`)" for title, path in report.plots.items()), ""]
    lines += lineage_section(report)
    if links:
        lines += ["## Links", *(f"- [{label}]({url})" for label, url in links.items()
                                if not label.startswith(PLOT_LINK)), ""]
    return "\n".join(lines)


def reference_line(report: ReleaseReport) -> str:
    """How often this release scored the fp32 reference on the eval set, and who reused it (the count the
    reference cache logged, release/gating/reference.py); "" when nothing used it."""
    found = report.reference_scoring
    if not found:
        return ""
    times = "once" if found["scorings"] == 1 else f"{found['scorings']} times"
    reused = [u["by"] for u in found.get("uses", []) if not u.get("scored")]
    by = f"; reused by {', '.join(dict.fromkeys(reused))} ({len(reused)}x)" if reused else ""
    return f"fp32 reference scored on the eval set {times} in this release ({found['seconds']:.1f} s){by}."


def verdict_sentence(report: ReleaseReport) -> str:
    version = f"v{report.version}" if report.version else "nothing registered"
    return {"released": f"{version} passed validation and every gate.",
            "re-gated": f"{version} already served this package; the gates ran again and are recorded on it.",
            "blocked": "nothing was released; production is unchanged.",
            "dry-run": "every stage and gate ran; nothing was registered.",
            "error": "the release stopped on an error; production is unchanged."}.get(report.outcome, "")


def _against(report: ReleaseReport) -> str:
    links, prod = report.links, report.production or {}
    if report.version is not None and str(prod.get("version")) == report.version:
        return ""  # re-gated: compared with itself, as production
    if REPLACED in links:
        replaced = (report.aliases.get("previous") or [None, None])[1]
        return f" Replaced production {_link(f'v{replaced}', links[REPLACED])}."
    if prod:
        return f" Compared with production {_link('v' + str(prod['version']), links.get(COMPARED))}."
    return " First release of this model: nothing to compare with."


def _provenance(report: ReleaseReport) -> str:
    links = report.links
    release = _link(str(report.release_run), links.get(RELEASE_RUN_LINK))
    text = f"Promoted by relctl from training run {_link(report.training_run, links.get(TRAINING_RUN_LINK))}"
    if len(report.release_runs) > 1:
        return (f"{text}; gated again by release run {release} (this report). The package was registered by "
                f"release run `{report.release_runs[0]}`, which holds it.")
    return f"{text} (release run {release})."


def decision_table(report: ReleaseReport) -> list[str]:
    """One row per check that decided the verdict, each with its deciding figures (failed checks first)."""
    rows: list[tuple[str, str, str]] = []
    if report.validation:
        checks = report.validation.get("checks", [])
        rows.append((f"validation vs fp32 ({report.precision})", _status(all(c["passed"] for c in checks)),
                     _figures(checks) + tie_note(report.validation.get("metrics") or {})))
    for gate in report.gates:
        details = gate.get("details") or {}
        paired = paired_figures(details.get("paired") or [])
        tasks = harness_figures(details.get("harness_scores") or [])
        figures = "; ".join(f for f in (paired, tasks, _figures(gate.get("thresholds") or [])) if f) or \
            _clip(gate.get("reason", ""))
        rows.append((f"gate `{gate['gate']}`", str(gate["status"]), figures))
    fit = memory_fit(report)
    if fit:
        rows.append(("memory fit", *fit))
    cost = next((g["metrics"]["cost_per_million_tokens"] for g in report.gates
                 if _is_number(g.get("metrics", {}).get("cost_per_million_tokens"))), None)
    if cost is not None:
        rows.append(("cost", "", f"${_sig(cost)} per million output tokens (load gate)"))
    if not rows:
        return []
    return ["## What decided it", "| check | result | deciding figures |", "|---|---|---|",
            *(f"| {what} | {status} | {figures} |" for what, status, figures in rows), ""]


def tie_note(metrics: dict[str, Any]) -> str:
    """What validation's top-1 agreement counted (release/stages/top1.py): tie-aware, beside the raw figure."""
    if not _is_number(metrics.get("top1_agreement_raw")):
        return ""
    ties = int(metrics.get("top1_near_ties", 0))
    plural = "" if ties == 1 else "s"
    return (f"; top-1 is tie-aware (raw {_sig(metrics['top1_agreement_raw'])}: {ties} near-tie{plural} and "
            f"{int(metrics.get('top1_repeated_prefixes', 0))} repeated prefixes not counted)")


def _status(passed: bool) -> str:
    return "pass" if passed else "**fail**"


def _figures(checks: list[dict[str, Any]]) -> str:
    """`metric value op bound` per check, failed first, at most MAX_FIGURES."""
    ordered = sorted(checks, key=lambda c: bool(c.get("passed")))
    shown = [f"{c['metric']} {_sig(c.get('value'))} {c['op']} {_sig(c.get('bound'))}"
             + ("" if c.get("passed") else " (**fail**)") for c in ordered[:MAX_FIGURES]]
    more = len(ordered) - len(shown)
    return "; ".join(shown) + (f"; {more} more in the details" if more > 0 else "")


def paired_figures(comparisons: list[dict[str, Any]]) -> str:
    """`metric vs baseline: difference [interval], n, margin: outcome` per paired comparison (a gate's
    details["paired"], gates/paired.py), the undecided and inferior first, at most MAX_FIGURES."""
    ordered = sorted(comparisons, key=lambda c: c.get("outcome") == "non_inferior")
    shown = []
    for c in ordered[:MAX_FIGURES]:
        low, high = c["interval"]
        outcome = str(c["outcome"]).replace("_", "-")
        if c["outcome"] == "underpowered" and c.get("needed_n"):
            outcome += f", needs about {c['needed_n']} samples for {c.get('power', 0.8):.0%} power"
        shown.append(markdown(f"{c['metric']} vs {c['against']}: {c['difference']:+.3g} "
                              f"[{low:+.3g}, {high:+.3g}], n={c['n']}, margin {c['margin']:g}")
                     + ("" if c["outcome"] == "non_inferior" else f" (**{outcome}**)"))
    more = len(ordered) - len(shown)
    return "; ".join(shown) + (f"; {more} more in the details" if more > 0 else "")


def harness_figures(scores: list[dict[str, Any]]) -> str:
    """Each harness task's own score, candidate beside production (a gate's details["harness_scores"],
    gates/harness/results.py), at most MAX_FIGURES."""
    own = [s for s in scores if s.get("own", True)]
    shown = [markdown(f"{s['task']} {s['metric']} {_sig(s['candidate'])}"
                      + ("" if s.get("production") is None else f" (production {_sig(s['production'])})"))
             for s in own[:MAX_FIGURES]]
    more = len(own) - len(shown)
    return "; ".join(shown) + (f"; {more} more in the details" if more > 0 else "")


def memory_fit(report: ReleaseReport) -> tuple[str, str] | None:
    """(verdict, figures) on one target: the memory gate's when it ran, else the serving target the memory
    stage planned for. Never both: two targets on one page contradict each other."""
    gate = next((g for g in report.gates if g["gate"] == "memory" and g["status"] != "skipped"), None)
    if gate is not None:
        m = gate.get("metrics", {})
        if _is_number(m.get("peak_gib")) and _is_number(m.get("budget_gib")):
            fits = m["peak_gib"] <= m["budget_gib"]
            return ("fits" if fits else "**does not fit**",
                    f"peak {size(m['peak_gib'] * 2**30)} of a {size(m['budget_gib'] * 2**30)} budget on the memory "
                    f"gate's target; up to {_sig(int(m.get('max_concurrency', 0)))} concurrent sequences")
    mem = report.memory
    if mem and _is_number(mem.get("peak_bytes")) and _is_number(mem.get("capacity_bytes")):
        return ("fits" if mem.get("fits") else "**does not fit**",
                f"peak {size(mem['peak_bytes'])} of {size(mem['capacity_bytes'])} (serving target) at "
                f"{mem.get('concurrency')} x {mem.get('context_tokens')} tokens; up to "
                f"{mem.get('max_concurrency')} concurrent sequences")
    return None


def _clip(text: str, limit: int = 160) -> str:
    return markdown(text if len(text) <= limit else text[:limit] + "…")   # free text: no table cell escapes it


def lineage_section(report: ReleaseReport) -> list[str]:
    training = report.lineage.get("training", {})
    ckpt = report.lineage.get("checkpoint", {})
    repo = report.lineage.get("release_repo", {})
    return [
        "## Lineage",
        "| what | value |",
        "|---|---|",
        f"| training run | {_link(str(training.get('run_id')), report.links.get(TRAINING_RUN_LINK))} "
        f"({markdown(training.get('run_name'))}) |",
        f"| training commit | {_commit(training.get('git_commit'), training.get('git_dirty'))} |",
        *[f"| data `{name}` sha256 | `{digest}` |" for name, digest in training.get("data_sha256", {}).items()],
        f"| config.json sha256 | `{ckpt.get('config_sha256')}` |",
        *[f"| weights `{name}` sha256 | `{digest}` |" for name, digest in ckpt.get("weights_sha256", {}).items()],
        *[f"| adapter `{name}` sha256 | `{digest}` |" for name, digest in ckpt.get("adapter_sha256", {}).items()],
        f"| release.yaml repo commit | {_commit(repo.get('commit'), repo.get('dirty'))} |",
        f"| package manifest sha256 | `{report.package.get('manifest_sha256')}` |",
        f"| serving config hash | `{report.package.get('serving_config_hash')}` |",
        "",
    ]


def details_markdown(report: ReleaseReport, gates_markdown: str | None) -> str:
    """Every figure behind the card (the release run's report/details.md): validation against the reference
    and production, the memory plan on the card's one target, each gate's table (load rows included), and
    every number the release logged."""
    prod = (report.production or {}).get("metrics", {})
    lines = [f"# {report.model} — every figure of release run `{report.release_run}`", ""]
    if report.validation:
        lines += ["## Validation against the fp32 reference", "| metric | value | bound | production | result |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c['metric']} | {_sig(c['value'])} | {c['op']} {_sig(c['bound'])} | "
                  f"{_sig(prod.get(T.VALIDATION_PREFIX + c['metric']))} | {_status(c['passed'])} |"
                  for c in report.validation.get("checks", [])]
        lines.append("")
    gate = next((g for g in report.gates if g["gate"] == "memory" and g["status"] != "skipped"), None)
    if gate is None and report.memory:
        lines += memory_section(report.memory)
    elif gate is not None:
        lines += ["## Memory plan (the memory gate's target)", str(gate.get("reason", "")), ""]
    if gates_markdown:
        lines += [gates_markdown.replace("### relctl gates", "## Gates"), ""]
    numbers = release_metrics(report)
    if numbers:
        lines += ["## Every number", "| metric | value |", "|---|---|",
                  *(f"| {k} | {_sig(v)} |" for k, v in sorted(numbers.items())), ""]
    return "\n".join(lines)


MEMORY_ROWS = (("peak_bytes", "peak (all replicas of a rollout)"), ("capacity_bytes", "accelerator memory"),
               ("headroom_bytes", "kept free (headroom)"), ("per_replica_bytes", "one replica"),
               ("weights_bytes", "weights"), ("kv_cache_bytes", "KV cache"), ("workspace_bytes", "workspace"))


def memory_section(memory: dict[str, Any]) -> list[str]:
    """The memory plan as a table a reviewer reads: what fits, at what load, and where the bytes go."""
    verdict = "fits" if memory.get("fits") else "**does not fit**"
    lines = ["## Memory plan",
             f"{verdict} at {memory.get('concurrency')} concurrent sequences x {memory.get('context_tokens')} "
             f"tokens, {memory.get('rollout_replicas')} replica(s) during a rollout; at most "
             f"{memory.get('max_concurrency')} concurrent sequences fit.", "",
             "| | size |", "|---|---|"]
    lines += [f"| {label} | {size(memory[key])} |" for key, label in MEMORY_ROWS
              if isinstance(memory.get(key), (int, float))]
    return [*lines, ""]


def _link(text: str, url: str | None, code: bool = True) -> str:
    shown = f"`{text}`" if code else text
    return f"[{shown}]({url})" if url else shown


def summary_markdown(report: ReleaseReport, gates_markdown: str | None) -> str:
    """A CI job summary: the outcome, validation against the reference, then the gate table."""
    headline = {
        "released": f"✅ **{report.model} v{report.version}** is production",
        "blocked": f"❌ **{report.model}**: release blocked — nothing registered, production unchanged",
        "dry-run": f"🧪 **{report.model}**: dry run passed — nothing registered",
        "unchanged": f"⏺️ **{report.model} v{report.version}** already serves this package — nothing moved",
        "re-gated": f"🔁 **{report.model} v{report.version}** already serves this package — the new gate "
                    "results are recorded on it",
    }.get(report.outcome, f"⚠️ **{report.model}**: {report.outcome}")
    lines = [f"## relctl promote `{report.training_run}`", "", headline, ""]
    lines += [f"- {job_summary(failure)}" for failure in report.failures]
    lines += [f"- ⚠️ {job_summary(note)}" for note in report.notes]
    if report.validation:
        lines += ["", f"### Validation ({report.precision} vs fp32 reference)", "",
                  "| metric | value | bound | result |", "|---|---|---|---|"]
        lines += [f"| {c['metric']} | {_fmt(c['value'])} | {c['op']} {_fmt(c['bound'])} | "
                  f"{'pass' if c['passed'] else '**fail**'} |" for c in report.validation.get("checks", [])]
    lines += ["", *engines_section(report.engines, "### Engines side by side")] if report.engines else []
    if gates_markdown:
        lines += ["", gates_markdown]
    return "\n".join(lines) + "\n"


def release_metrics(report: ReleaseReport) -> dict[str, float]:
    """Every number of the release, named as on the release run and the version's LoggedModel."""
    out: dict[str, float] = {}
    for key, value in (report.validation or {}).get("metrics", {}).items():
        if _is_number(value):
            out[f"{T.VALIDATION_PREFIX}{key}"] = float(value)
    for gate in report.gates:
        out |= {T.gate_metric(gate["gate"], k): float(v) for k, v in gate.get("metrics", {}).items() if _is_number(v)}
    for key, value in (report.memory or {}).items():
        if _is_number(value):
            out[f"{T.MEMORY_PREFIX}{key}"] = float(value)
    return out


def release_details(report: ReleaseReport) -> dict[str, str]:
    """Digests a later release compares against (e.g. the eval set's, so production's scores are reused)."""
    return {T.gate_metric(g["gate"], "dataset_sha256"): str(g["details"]["dataset_sha256"])
            for g in report.gates if "dataset_sha256" in g.get("details", {})}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
