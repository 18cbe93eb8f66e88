"""The release report (JSON, every number) and the model card (markdown, the version's description)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from release.core.errors import EXIT_BLOCKED, EXIT_RELEASED
from release.pipeline.engines import engines_section
from release.registry import tags as T

# report.links labels the card builds sentences from
RELEASE_RUN_LINK, TRAINING_RUN_LINK, VERSION_LINK = "release run", "training run", "version"
REPLACED, COMPARED = "production it replaced", "production it was compared with"
PLOT_LINK = "plot: "
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
    # engines: side by side (release/pipeline/engines.py): the plan, one row per engine, the choice and why.
    engines: dict[str, Any] | None = None

    def block(self, failures: list[str]) -> None:
        self.outcome, self.exit_code = "blocked", EXIT_BLOCKED
        self.failures.extend(failures)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def _commit(commit: Any, dirty: Any) -> str:
    if not commit:
        return "not recorded (not a git repository)"
    state = {"true": "uncommitted changes", "false": "clean", True: "uncommitted changes", False: "clean"}
    return f"`{commit}` ({state.get(dirty, 'state unknown')})"


def model_card(report: ReleaseReport, extra_sections: list[str] | None = None) -> str:
    """Markdown shown as the registered version's description in the MLflow UI: where it came from (links),
    the gate table, validation against thresholds and production, the memory plan, and the plots."""
    training = report.lineage.get("training", {})
    ckpt = report.lineage.get("checkpoint", {})
    repo = report.lineage.get("release_repo", {})
    links = report.links
    prod = report.production or {}
    if REPLACED in links:
        replaced = (report.aliases.get("previous") or [None, None])[1]
        against = f" Replaced production {_link(f'v{replaced}', links[REPLACED])}."
    elif prod:
        against = f" Compared with production {_link('v' + str(prod['version']), links.get(COMPARED))}."
    else:
        against = " First release of this model: nothing to compare with."
    lines = [
        f"# {report.model} — {report.precision} ONNX",
        "",
        (f"Promoted by relctl from training run {_link(report.training_run, links.get(TRAINING_RUN_LINK))} "
         f"(release run {_link(str(report.release_run), links.get(RELEASE_RUN_LINK))}). "
         f"Outcome: **{report.outcome}**." + against),
        "",
    ]
    if METRICS_LINK in links:
        lines += [f"Every number of this release is a metric of the version's [logged model]({links[METRICS_LINK]}) "
                  "(the Source Model above) and of the release run.", ""]
    for section in extra_sections or []:
        lines += [section, ""]
    if report.validation:
        production = prod.get("metrics", {})
        lines += ["## Validation against the fp32 reference", "| metric | value | bound | production | result |",
                  "|---|---|---|---|---|"]
        for check in report.validation.get("checks", []):
            before = production.get(f"{T.VALIDATION_PREFIX}{check['metric']}")
            lines.append(
                f"| {check['metric']} | {_fmt(check['value'])} | {check['op']} {_fmt(check['bound'])} | "
                f"{_fmt(before)} | {'pass' if check['passed'] else '**fail**'} |"
            )
        lines.append("")
    if report.memory:
        lines += memory_section(report.memory)
    lines += engines_section(report.engines)
    if report.plots:
        lines += ["## Plots", *(f"- {_link(title, links.get(PLOT_LINK + title), code=False)}"
                                f" (release run artifact `{path}`)" for title, path in report.plots.items()), ""]
    lines += [
        "## Lineage",
        "| what | value |",
        "|---|---|",
        f"| training run | {_link(str(training.get('run_id')), links.get(TRAINING_RUN_LINK))} "
        f"({training.get('run_name')}) |",
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
    if report.failures:
        lines += ["## Why it was blocked", *(f"- {f}" for f in report.failures), ""]
    if report.notes:
        lines += ["## Notes", *(f"- {n}" for n in report.notes), ""]
    if links:
        lines += ["## Links", *(f"- [{label}]({url})" for label, url in links.items()
                                if not label.startswith(PLOT_LINK)), ""]
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
             "| | GiB |", "|---|---|"]
    lines += [f"| {label} | {memory[key] / 2**30:.3f} |" for key, label in MEMORY_ROWS
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
    lines += [f"- {failure}" for failure in report.failures]
    lines += [f"- ⚠️ {note}" for note in report.notes]
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
