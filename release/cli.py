"""The `relctl` command line: parse, call one api function, map errors to exit codes. No logic here."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from release import __version__
from release.commands.support import Ctx, emit, fail, handled, json_option, quiet_on_closed_stdout
from release.core.errors import Blocked, InputError
from release.core.escape import terminal
from release.pipeline.failure import raise_on_sigterm

STARTED = time.monotonic()  # this module loads first: what a command prints as its start-up seconds
GLOBAL_FLAGS = ("-q", "--quiet", "--traceback")
GLOBAL_WITH_VALUE = ("--project-dir",)
# Commands that make the project folder, so a --project-dir that does not exist yet is what they expect.
CREATES_PROJECT = ("init",)


def _option_names(command: click.Command) -> set[str]:
    names = {opt for param in command.params for opt in getattr(param, "opts", [])}
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            names |= _option_names(sub)
    return names


def hoist_global_options(group: click.Group, args: list[str]) -> list[str]:
    """`relctl status -q --project-dir X` means `relctl -q --project-dir X status`: global options may
    follow the subcommand, unless that subcommand has an option of the same name (serve's --project-dir)."""
    position = next((i for i, a in enumerate(args) if a in group.commands), None)
    if position is None:
        return args
    own = _option_names(group.commands[args[position]])
    head, tail, moved = args[:position], [], []
    rest = iter(args[position:])
    for arg in rest:
        if arg == "--":
            tail += [arg, *rest]
            break
        name = arg.split("=", 1)[0]
        if name in own:
            tail.append(arg)
        elif arg in GLOBAL_FLAGS:
            moved.append(arg)
        elif name in GLOBAL_WITH_VALUE:
            moved += [arg] if "=" in arg else [arg, next(rest, "")]
        else:
            tail.append(arg)
    return head + moved + tail


class RelctlGroup(click.Group):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_global_options(self, args))

    # A closed stdout (`relctl ... | head`) ends every command quietly with exit 0, help and usage included:
    # here, inside click's own handler (which would exit 1), and in `handled` for the commands' bodies.
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        with quiet_on_closed_stdout():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with quiet_on_closed_stdout():
            return super().invoke(ctx)


@click.group(cls=RelctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="relctl")
@click.option("--project-dir", type=click.Path(file_okay=False, path_type=Path), default=".",
              show_default=True, help="Folder holding release.yaml and the embedded MLflow store (.relctl/).")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the full traceback on errors.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@click.pass_context
def cli(click_ctx: click.Context, project_dir: Path, show_traceback: bool, quiet: bool) -> None:
    """Turn an MLflow training run into a gated, rollback-able serving version."""
    click_ctx.obj = Ctx(project_dir.resolve(), show_traceback, quiet)
    if not project_dir.is_dir() and click_ctx.invoked_subcommand not in CREATES_PROJECT:
        # A typo here would otherwise create an empty store and report "run not found".
        fail(click_ctx.obj, InputError(f"--project-dir {project_dir}: no such folder",
                                       hint="check the path (relctl init DIR creates a new project)"))


@cli.command()
@click.argument("run_id")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="release.yaml, relative to PROJECT_DIR unless absolute (default: PROJECT_DIR/release.yaml if "
                   "present, else built-in defaults).")
@click.option("--precision", help="Override convert.precision (one an installed backend builds: relctl backends).")
@click.option("--model", "model_name", help="Override the registered model name.")
@click.option("--dry-run", is_flag=True, help="Run every stage and gate; register nothing, move no alias.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Append a markdown summary to this file, e.g. \"$GITHUB_STEP_SUMMARY\" (also when blocked).")
@click.option("--keep-going", is_flag=True,
              help="Run every gate even after one failed (default: the later gates are skipped, the release "
                   "is blocked either way).")
@click.option("--onto", metavar="MODEL@ALIAS|MODEL/VERSION",
              help="Release the run's LoRA adapter onto this serving base, unmerged (docs/adapters.md); --model "
                   "names the adapter's registered model (default BASE-EXPERIMENT). release.yaml: "
                   "release: {mode: adapter, onto: ...}.")
@click.option("--server", "canary_server", metavar="URL",
              help="With --onto and gates.canary: the running `relctl serve BASE --adapters` the new version is "
                   "canaried on against the adapter's production (its admin key in RELCTL_ADMIN_KEY, its "
                   "completions key, if any, in RELCTL_API_KEY).")
@click.option("--strand-adapters", is_flag=True,
              help="Release a base even though production adapters were built for the production version it "
                   "replaces (release.yaml: release.strand_adapters: true); refused otherwise, naming them.")
@json_option
@click.pass_obj
@handled
def promote(ctx: Ctx, run_id: str, config_path: Path | None, precision: str | None, model_name: str | None,
            dry_run: bool, summary_path: Path | None, keep_going: bool, onto: str | None, canary_server: str | None,
            strand_adapters: bool, as_json: bool) -> None:
    """Promote training run RUN_ID to production (exit 0), or say why not (1 blocked, 2 bad input)."""
    from release.commands.preflight import preflight
    from release.core.progress import Progress

    ctx.as_json = as_json
    from release.adapters.target import adapter_onto  # light: a merged release loads no adapter code

    onto = adapter_onto(onto, ctx.project_dir, config_path)  # --onto, or release.yaml's release.mode: adapter
    if onto is not None:  # an adapter release: its own flow (release/adapters)
        from release.adapters.api import promote_onto

        adapter = promote_onto(run_id, onto, ctx.project_dir, config_path, {}, model_name, dry_run,
                               Progress(quiet=ctx.quiet), canary_server)
        emit(adapter.to_dict(), as_json, lambda: click.echo(
            f"{adapter.model} v{adapter.version} is production on {adapter.base['model']} v{adapter.base['version']}"
            if adapter.outcome == "released" else
            f"{adapter.model} v{adapter.version} passed its checks and waits for an approval: relctl approve "
            f"{adapter.model}/{adapter.version} --reason ..." if adapter.outcome == "awaiting-approval" else
            f"{adapter.model}: {adapter.outcome}"
            + (f" (v{adapter.version})" if adapter.version else " (nothing registered)")))
        if adapter.canary is not None and not adapter.canary["passed"]:
            raise Blocked(f"{adapter.model} v{adapter.version}: canary {adapter.canary['reason']}",
                          hint=f"evidence: {adapter.canary['evidence'][0] if adapter.canary['evidence'] else '-'}")
        return
    if canary_server is not None:
        raise InputError("--server: the base server of an adapter's canary; it goes with --onto",
                         hint="relctl promote RUN --onto BASE@production --server URL")
    overrides: dict[str, Any] = {"release.strand_adapters": True} if strand_adapters else {}
    if precision:
        overrides["convert.precision"] = precision
    if model_name:
        overrides["model"] = model_name
    # release.yaml and the flags first: a bad value is refused before api (the registry client, MLflow) loads.
    loaded = preflight(ctx.project_dir, config_path, overrides)
    from release.commands import api

    progress = Progress(quiet=ctx.quiet)
    report = api.promote(run_id, ctx.project_dir, config_path, overrides, dry_run, progress, summary_path,
                         keep_going, loaded)
    if report.outcome == "awaiting-approval":
        done = (f"{report.model} v{report.version} passed its gates and waits for an approval: "
                f"relctl approve {report.model}/{report.version} --reason ...")
    elif report.version:
        done = f"{report.model} v{report.version} is production"
    else:
        done = f"{report.model}: {report.outcome} (nothing registered)"
    emit(report.to_dict(), as_json, lambda: click.echo(done))


@cli.command()
@click.argument("spec", required=False, metavar="HEADERS_FILE|MODEL:VERSION")
@click.option("--response-id", help="A response id from relctl serve's request log instead of SPEC.")
@click.option("--log-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Request-log folder for --response-id (default: PROJECT_DIR/.relctl/request-logs).")
@json_option
@click.pass_obj
@handled
def trace(ctx: Ctx, spec: str | None, response_id: str | None, log_dir: Path | None, as_json: bool) -> None:
    """From a served response (its X-Relctl-* headers, or its id) back to the training run; exit 1 when the
    package no longer matches what was released."""
    from release.commands import trace as tr
    from release.core.errors import Blocked
    from release.registry.client import open_registry
    from release.signing.keys import project_trust

    if response_id:
        model, version, served = tr.target_from_log(log_dir or ctx.project_dir / ".relctl" / "request-logs",
                                                   response_id)
    elif spec and Path(spec).is_file():
        model, version, served = tr.target_from_headers(Path(spec).read_text())
    elif spec:
        (model, version), served = tr.parse_spec(spec), None
    else:
        raise InputError("nothing to trace", hint="pass a headers file, MODEL:VERSION or --response-id ID")
    chain = tr.trace(open_registry(ctx.project_dir, read_only=True), model, version, served,
                     project_trust(ctx.project_dir))
    emit(chain, as_json, lambda: click.echo("\n".join(tr.render(chain))))
    if not chain["integrity"]["ok"]:
        problem = str(chain["integrity"]["problem"])  # already names the version when a check found it
        raise Blocked(problem if problem.startswith(f"{model} v{version}") else f"{model} v{version}: {problem}",
                      hint="the served package differs from the released one; re-deploy from the registry")


@cli.command()
@click.argument("run_id")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="release.yaml, relative to PROJECT_DIR unless absolute (default: PROJECT_DIR/release.yaml if "
                   "present, else built-in defaults).")
@click.option("--onto", metavar="MODEL@ALIAS|MODEL/VERSION",
              help="Check the run as `promote --onto` releases it: its LoRA adapter onto this serving base "
                   "(release.yaml: release: {mode: adapter, onto: ...}).")
@click.option("--model", "model_name", help="Override the registered model name (with --onto: the adapter's).")
@json_option
@click.pass_obj
@handled
def check(ctx: Ctx, run_id: str, config_path: Path | None, onto: str | None, model_name: str | None,
          as_json: bool) -> None:
    """Check RUN_ID against the run contract and release.yaml in seconds: every problem at once (exit 2)."""
    from release.commands.preflight import preflight
    from release.core.errors import InputProblems

    ctx.as_json = as_json
    loaded = preflight(ctx.project_dir, config_path)  # before api: a bad release.yaml never loads MLflow
    from release.commands import api

    report = api.check(run_id, ctx.project_dir, config_path, onto, model_name, loaded)
    data = {"run_id": run_id, "ok": not report.problems, "model": report.model, "found": report.found,
            "warnings": report.warnings,
            "needs": report.needs, "bounds": report.bounds,
            "problems": [{"error": p.message, "hint": p.hint} for p in report.problems]}
    if as_json:
        emit(data, True, lambda: None)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    if report.problems:
        raise InputProblems([(p.message, p.hint) for p in report.problems])
    if not as_json:
        click.echo(f"run {run_id} meets the run contract: checkpoint, prompts"
                   + (", eval set" if report.found.get("eval_data") else "") + " found; release.yaml checks out"
                   + (f"; the adapter goes onto its base as {report.model}" if report.found.get("base") else ""))
        if report.needs:
            from release.core.units import size

            n = report.needs
            click.echo(f"the release needs about {size(n['memory_bytes'])} of memory (set by {n['memory_set_by']}) "
                       f"and {size(n['disk_bytes'])} of disk ({n['precision']} of a {size(n['checkpoint_bytes'])} "
                       f"checkpoint, candidate {size(n['candidate_bytes'])})")
        for line in report.bounds:
            click.echo(line)


@cli.command()
@click.argument("model")
@click.option("--to", "to_version", help="Version to return to (default: the 'previous' alias).")
@click.option("--reason", default="manual rollback", show_default=True, help="Recorded in the alias history.")
@click.option("--allow-unreleased", is_flag=True,
              help="Allow a target that never passed its gates (rejected, stopped, registering); recorded.")
@click.option("--server", "server_url", metavar="URL",
              help="An adapter's rollback: checked first (RELCTL_ADMIN_KEY, the server answers and runs the "
                   "adapter's base), then the alias moves and the adapter is switched on this running base (relctl "
                   "serve --adapters), no base restart.")
@click.option("--strand-adapters", is_flag=True,
              help="Roll a base back even though production adapters were built for the version it leaves.")
@json_option
@click.pass_obj
@handled
def rollback(ctx: Ctx, model: str, to_version: str | None, reason: str, allow_unreleased: bool,
             server_url: str | None, strand_adapters: bool, as_json: bool) -> None:
    """Move MODEL's production alias back to the version it replaced, in one step."""
    from release.commands import api

    # The split is printed so that a test or a benchmark reads it, never guesses it from the wall clock: start
    # (interpreter, CLI), registry_open, verify (the target's package), probe (the server), alias_move, switch.
    seconds = {"start": round(time.monotonic() - STARTED, 3)}
    server = None
    if server_url:
        from release.adapters.rollback import switch_server

        server = switch_server(server_url)  # no admin key: refused before the registry is opened
    move = api.rollback(model, ctx.project_dir, reason, to_version, allow_unreleased=allow_unreleased,
                        strand_adapters=strand_adapters, seconds=seconds, server=server)
    if server is not None:
        switched = server.answer
        seconds |= {"switch": switched["seconds"], "switch_round_trip": switched["round_trip_s"]}
        click.echo(f"{server_url} serves {model} v{switched['version']} (was v{switched['replaced']}; switched in "
                   f"{switched['seconds']:.2f}s, the base kept serving)", err=True)
    frm, to = move.changes["production"]
    engines = api.engine_labels(model, ctx.project_dir)
    shown = {v: engines.get(v, "engine not recorded") for v in (frm, to) if v is not None}
    seconds["total"] = round(time.monotonic() - STARTED, 3)
    if not ctx.quiet:
        click.echo("rollback seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()), err=True)
    emit({**asdict(move), "engines": shown, "seconds": seconds}, as_json,
         lambda: click.echo(f"{model}: production {_versions(frm, shown)} -> {_versions(to, shown)}"))


def _versions(version: str | None, engines: dict[str, str]) -> str:
    """"v2 (ENGINE PRECISION)": a version with the engine and precision it serves on; "-" for none."""
    return "-" if version is None else f"v{version} ({engines[version]})" if version in engines else f"v{version}"


@cli.command()
@click.argument("spec", metavar="MODEL/VERSION")
@click.option("--reason", required=True, help="Why this version may serve production; recorded and signed.")
@json_option
@click.pass_obj
@handled
def approve(ctx: Ctx, spec: str, reason: str, as_json: bool) -> None:
    """Approve a version that passed its gates and waits for an approval (release.yaml require_approval): the
    approval (you: $RELCTL_USER, else git's user.email, else your login) is recorded, signed with the release
    key when one is configured, and production moves to the version."""
    from release.commands import api
    from release.core.progress import Progress

    done = api.approve(spec, ctx.project_dir, reason, Progress(quiet=ctx.quiet))
    a = done.approval
    data = {"approval": asdict(a), "signed_by": done.signed_by, "move": asdict(done.move) if done.move else None}
    emit(data, as_json, lambda: click.echo(
        f"{a.model} v{a.version} approved by {a.approver} ({a.approver_source}); it is production"
        + (f" (signed with {done.signed_by})" if done.signed_by else " (approval unsigned: signing is off)")))


@cli.command()
@click.argument("model")
@json_option
@click.pass_obj
@handled
def history(ctx: Ctx, model: str, as_json: bool) -> None:
    """Every alias move of MODEL: when, from, to, why, by which release run."""
    from release.commands import api

    moves = api.history(model, ctx.project_dir)
    engines = api.engine_labels(model, ctx.project_dir) if moves else {}

    def text() -> None:
        if api.signing_off(ctx.project_dir):
            click.echo("unsigned: release.yaml says `signing: off`, so no version below is signed or verified")
        for m in moves:
            changes = ", ".join(f"{a}: {_versions(f, engines)} -> {_versions(t, engines)}"
                                for a, (f, t) in sorted(m.changes.items()))
            line = f"{m.at}  {m.action:<8} {changes}  ({m.reason}; run {m.release_run or '-'}; by {m.user})"
            click.echo(terminal(line))   # one entry, one line: a reason cannot forge another or move the cursor

    emit([{**asdict(m), "engines": {v: engines[v] for pair in m.changes.values() for v in pair if v in engines}}
          for m in moves], as_json, text)


@cli.command()
@click.argument("spec", metavar="MODEL/VERSION|MODEL@ALIAS|PACKAGE_DIR")
@json_option
@click.pass_obj
@handled
def verify(ctx: Ctx, spec: str, as_json: bool) -> None:
    """Check a version's package against its manifest and its signature by a trusted key (exit 2 if not)."""
    from release.commands import api

    data = api.verify(spec, ctx.project_dir)
    what = f"{data['model']} v{data['version']}" if "model" in data else data["package"]
    if data["signature"] != "verified":
        # Fail closed on every path: with no trusted key in effect (signing: off, or none configured) the files
        # may match their manifest, but nothing vouches that the manifest is the released one.
        raise InputError(f"{what}: files match the manifest, but no signature was verified ({data['signature']}: "
                         + ("release.yaml says `signing: off`" if data["signature"] == "unsigned"
                            else "this project trusts no release key") + ")",
                         hint="turn signing on (drop `signing: off`, run `relctl keygen`, then `relctl sign MODEL` for "
                              "the versions released unsigned) to verify signatures")
    approval = data.get("approval")
    approved = f"; {approval['text']}" if approval else ""
    signed = f"signed by {data['signed_by']} ({str(data['fingerprint'])[:16]})"
    base = data.get("adapter_of")
    bound = (f"; an adapter bound by its signed package to {base['model']} v{base['version']} (base "
             f"{base['sha256']})" if base else "")
    emit(data, as_json, lambda: click.echo(f"{what}: verified, {signed}{approved}{bound}"))


@cli.command()
@click.argument("model", required=False)
@json_option
@click.pass_obj
@handled
def status(ctx: Ctx, model: str | None, as_json: bool) -> None:
    """Aliases -> versions of MODEL with lineage and gate summary (no MODEL: list registered models)."""
    from release.commands import api

    data = api.status(model, ctx.project_dir)

    def text() -> None:
        from release.commands.serving_view import adapter_lines, server_lines

        if model is None:
            click.echo("\n".join(terminal(m) for m in data["models"]) or "no registered models")
            return
        for alias, info in data["aliases"].items():
            gates = ", ".join(f"{g}={s}" for g, s in info["gates"].items()) or "none"
            commit = str(info["git_commit"])[:10] if info["git_commit"] else "not recorded"
            click.echo(terminal(f"{model}@{alias}: v{info['version']} ({info['backend']} "
                       f"{info['precision'] or 'unknown precision'}) from run "
                       f"{info['training_run'] or 'unknown'} (commit {commit}; gates: {gates}; "
                       f"{info['signature']}{'; ' + info['approval'] if info['approval'] else ''})"))
        for line in [*adapter_lines(data), *server_lines(data["servers"])]:
            click.echo(terminal(line))

    emit(data, as_json, text)


@cli.command()
@click.option("--yes", "confirmed", is_flag=True, help="Delete; without it gc only lists what it would delete.")
@click.option("--all", "include_unfinished", is_flag=True,
              help="Also the work folders of unfinished releases (a re-run then starts over).")
@json_option
@click.pass_obj
@handled
def gc(ctx: Ctx, confirmed: bool, include_unfinished: bool, as_json: bool) -> None:
    """Remove work folders (.relctl/work/<run>) whose release finished; lists them unless --yes. Never the
    folder of a promote in flight."""
    from release.pipeline import workdirs
    from release.registry.client import open_registry
    from release.registry.store import STATE_DIR

    registry = open_registry(ctx.project_dir, read_only=True)
    work_root = ctx.project_dir / STATE_DIR / "work"
    uri = registry.store.tracking_uri
    plan = workdirs.plan_gc(work_root, uri, workdirs.finished_runs(registry), work_root)
    rows: list[dict[str, Any]] = []
    for folder in plan:
        wanted = folder.removable(include_unfinished)
        removed = confirmed and wanted and workdirs.collect(folder, uri, work_root, include_unfinished)
        rows.append({"run": folder.run_id, "bytes": folder.bytes, "finished": folder.finished,
                     "in_flight": folder.in_flight, "would_remove": wanted, "removed": removed})

    def text() -> None:
        from release.core.units import size

        for row, folder in zip(rows, plan, strict=True):
            if confirmed:   # what happened, not what was planned: a folder rmtree could not delete is "kept"
                verb = "removed" if row["removed"] else "kept"
            else:
                verb = "would remove" if row["would_remove"] else "keeps"
            click.echo(f"{verb:<12} {size(folder.bytes):>10}  {folder.run_id}  ({folder.action})")
        total = sum(r["bytes"] for r in rows if r["removed"] or (r["would_remove"] and not confirmed))
        click.echo(f"{'freed' if confirmed else 'would free'} {size(total)}"
                   + ("" if confirmed else "; run relctl gc --yes to delete"))

    emit(rows, as_json, text)


@cli.command()
@json_option
@handled
def backends(as_json: bool) -> None:
    """The installed serving-engine backends: precisions, execution providers and the families each takes."""
    from release.backends import available_backends, broken_backends

    found = available_backends()
    for name, why in broken_backends().items():
        click.echo(f"warning: backend '{name}' is installed but does not load: {why}", err=True)
    data = [{"id": b.id, "version": b.version(), "precisions": list(b.precisions),
             "execution_providers": list(b.execution_providers), "families": b.families,
             "precisions_by_provider": {p: list(b.precisions_for(p)) for p in b.execution_providers},
             "plan_options": list(b.plan_settings.model_fields) if b.plan_settings else [],
             "runtime_files": list(b.runtime_files),
             "deploy": {"image": b.deploy().image, "dockerfile": b.deploy().dockerfile,
                        "requirements": list(b.deploy().requirements)}} for b in found.values()]
    emit(data, as_json, lambda: click.echo("\n".join(b.describe() for b in found.values()) or "no backend installed"))


def _attach_commands() -> None:
    """Stage commands, serving and gates live beside their code; the group only lists them."""
    # Before mlflow is first imported: its INFO lines (table creation, downloads) drown relctl's own.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from release.canary.cli import canary_command
    from release.commands.cli import digest_command, init_command, keygen_command, sign_command
    from release.deploy.cli import publish_command, pull_command, render_group
    from release.gating.cli import gate
    from release.memory.cli import plan_command
    from release.serving.cli import serve_command
    from release.serving.loadgen.cli import bench_command
    from release.stages.cli import STAGE_COMMANDS
    from release.webhook.cli import webhook_command

    for command in [*STAGE_COMMANDS, gate, serve_command, bench_command, init_command, keygen_command, canary_command,
                    plan_command, webhook_command, render_group, publish_command, pull_command, sign_command,
                    digest_command]:
        cli.add_command(command)


_attach_commands()


def main() -> None:
    # SIGTERM (CI cancelling a job, Kubernetes stopping a pod) unwinds like Ctrl-C: children stopped,
    # the release run ended, one line, exit 143.
    raise_on_sigterm()
    cli(prog_name="relctl")
