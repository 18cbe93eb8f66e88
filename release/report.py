"""The release report (JSON, every number) and the model card (markdown, the version's description)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from release.errors import EXIT_BLOCKED, EXIT_RELEASED


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
    schema_version: int = 2
    model_uri: str | None = None                  # models:/NAME/VERSION once a version exists
    links: dict[str, str] = field(default_factory=dict)   # MLflow UI: version, release run, training run

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
    """Markdown shown as the registered version's description in the MLflow UI."""
    training = report.lineage.get("training", {})
    ckpt = report.lineage.get("checkpoint", {})
    repo = report.lineage.get("release_repo", {})
    lines = [
        f"# {report.model} — {report.precision} ONNX",
        "",
        (f"Promoted by relctl from training run `{report.training_run}` "
         f"(release run `{report.release_run}`). Outcome: **{report.outcome}**."),
        "",
        "## Lineage",
        "| what | value |",
        "|---|---|",
        f"| training run | `{training.get('run_id')}` ({training.get('run_name')}) |",
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
    if report.validation:
        lines += ["## Validation against the fp32 reference", "| metric | value | bound | result |",
                  "|---|---|---|---|"]
        for check in report.validation.get("checks", []):
            lines.append(
                f"| {check['metric']} | {_fmt(check['value'])} | {check['op']} {_fmt(check['bound'])} | "
                f"{'pass' if check['passed'] else '**fail**'} |"
            )
        lines.append("")
    if report.memory:
        mem = report.memory
        lines += ["## Memory plan", "```", *(f"{k}: {_fmt(v)}" for k, v in mem.items() if not isinstance(v, dict)),
                  "```", ""]
    for section in extra_sections or []:
        lines += [section, ""]
    if report.failures:
        lines += ["## Why it was blocked", *(f"- {f}" for f in report.failures), ""]
    if report.notes:
        lines += ["## Notes", *(f"- {n}" for n in report.notes), ""]
    if report.links:
        lines += ["## Links", *(f"- [{label}]({url})" for label, url in report.links.items()), ""]
    return "\n".join(lines)


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
    if gates_markdown:
        lines += ["", gates_markdown]
    return "\n".join(lines) + "\n"
