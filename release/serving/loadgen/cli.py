"""`relctl bench`: `relctl bench URL [options]` runs a benchmark (the default subcommand `run`);
`relctl bench merge DIR...` combines the segments of one plan run on several hosts.

No logic here: parse options, call release.serving.loadgen.bench, print.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from release.commands.support import handled
from release.core.errors import Blocked, InputError

RENDER_OPTIONS = {"render_job", "segments", "image", "job_name", "namespace", "results_claim", "as_json", "out_dir"}


class BenchGroup(click.Group):
    """A group whose first argument, unless it names a subcommand, is the URL of `run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def parse_slos(pairs: tuple[str, ...]) -> Any:
    from pydantic import ValidationError

    from release.serving.loadgen.summary import SLOs

    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"--slo {pair}: expected KEY=VALUE", hint="e.g. --slo ttft_p99_ms=500")
        values[key.strip()] = None if value.strip().lower() == "none" else value.strip()
    try:
        return SLOs.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"--slo {'.'.join(str(p) for p in err['loc'])}: {err['msg']}",
                         hint=f"known SLOs: {', '.join(SLOs.model_fields)}") from exc


@click.group("bench", cls=BenchGroup)
def bench_command() -> None:
    """Open-loop load test of any OpenAI-compatible endpoint.

    `relctl bench URL [OPTIONS]` is `relctl bench run URL [OPTIONS]`; `relctl bench merge DIR...`
    combines the segments of one plan run on several hosts (--segment i/N).
    """


@bench_command.command("run")
@click.argument("url")
@click.option("--compare", "others", multiple=True, help="another endpoint to run the same traffic against (repeat)")
@click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant", "trace"]), default="poisson",
              show_default=True, help="arrival process of the planned send times")
@click.option("--rate", type=float, default=None, help="requests/s (trace: rescale to it) [default: 4]")
@click.option("--burstiness", type=float, default=1.0, show_default=True, help="Gamma shape; < 1 is burstier")
@click.option("--requests", "count", type=click.IntRange(1), default=100, show_default=True,
              help="requests to send (the whole plan, also with --segment)")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="seconds of traffic: sets --requests to rate x duration")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="trace to replay (sets --arrival trace): relctl or Mooncake JSONL, a relctl serve request "
                   "log, bench/router records, or an Azure CSV (TIMESTAMP, ContextTokens, GeneratedTokens)")
@click.option("--dataset", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSONL of {prompt|messages, output_tokens} to draw requests from [default: synthetic prompts "
                   "sized to the endpoint's max_model_len]")
@click.option("--output-tokens", type=click.IntRange(1), default=32, show_default=True,
              help="output tokens of every synthetic request, and of dataset/trace rows that give none")
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True,
              help="sampling temperature sent with every request")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="/v1/completions or /v1/chat/completions")
@click.option("--model", default=None, help="model field to send [default: the endpoint's first /v1/models id]")
@click.option("--max-concurrency", type=click.IntRange(1), default=None,
              help="cap on requests in flight; waiting time is reported as client queue time")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True, help="per-request timeout (s)")
@click.option("--stream/--no-stream", default=True, show_default=True, help="SSE streaming (needed for TTFT/ITL)")
@click.option("--ignore-eos/--respect-eos", default=True, show_default=True,
              help="ask for exactly output_tokens tokens (the ignore_eos extension of OpenAI-compatible "
                   "engine servers)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of arrivals and sampled rows")
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True, help="unrecorded warm-up requests")
@click.option("--slo", "slo_pairs", multiple=True, metavar="KEY=VALUE",
              help="SLO, e.g. ttft_p99_ms=500, tpot_p95_ms=50, max_error_rate=0.01, request_ttft_ms=800")
@click.option("--sweep", "do_sweep", is_flag=True, help="find the highest rate that meets the SLOs")
@click.option("--sweep-rates", default=None, help="comma-separated rates to try instead of doubling + bisection")
@click.option("--step-duration", type=float, default=10.0, show_default=True, help="seconds per sweep step")
@click.option("--segment", default=None, metavar="I/N",
              help="send only segment I (0-based) of N of the plan: plan indices I, I+N, ... (merge with "
                   "`relctl bench merge`)")
@click.option("--start-at", type=float, default=None, metavar="EPOCH",
              help="Unix time at which the plan starts (the same on every host) [default: now]")
@click.option("--render-job", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path), default=None,
              help="write a Kubernetes indexed Job running this bench as --segments pods ('-': stdout); "
                   "sends nothing")
@click.option("--segments", type=click.IntRange(1), default=4, show_default=True, help="pods of --render-job")
@click.option("--image", default="relctl:latest", show_default=True, help="container image of --render-job")
@click.option("--job-name", default="relctl-bench", show_default=True, help="Job name of --render-job")
@click.option("--namespace", default=None, help="namespace of --render-job")
@click.option("--results-claim", default="relctl-bench-results", show_default=True,
              help="PersistentVolumeClaim (ReadWriteMany) the --render-job pods write their records to")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("relctl-bench"),
              show_default=True, help="folder for records-*.jsonl, summary.json and plots")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@handled
def run_command(url: str, others: tuple[str, ...], arrival: str, rate: float | None, burstiness: float,
                count: int, duration: float | None, trace: Path | None, dataset: Path | None,
                output_tokens: int, temperature: float, endpoint: str, model: str | None,
                max_concurrency: int | None, timeout_s: float, stream: bool, ignore_eos: bool, seed: int,
                warmup: int, slo_pairs: tuple[str, ...], do_sweep: bool, sweep_rates: str | None,
                step_duration: float, segment: str | None, start_at: float | None, render_job: Path | None,
                segments: int, image: str, job_name: str, namespace: str | None, results_claim: str,
                out_dir: Path, as_json: bool) -> None:
    """Open-loop load test of any OpenAI-compatible endpoint: TTFT, TPOT, ITL, E2EL, throughput,
    goodput, errors; --compare endpoints side by side, --sweep for the highest SLO-meeting rate, or
    --segment i/N for one host's share of a plan run from several. Exits 1 when an SLO is missed."""
    from release.serving.loadgen.bench import run_bench
    from release.serving.loadgen.client import ClientOptions
    from release.serving.loadgen.runner import Traffic
    from release.serving.loadgen.segments import parse_segment

    if render_job is not None:
        _render(click.get_current_context(), render_job, segments, start_at, image, job_name, namespace,
                results_claim)
        return
    if trace is not None and arrival == "poisson":
        arrival = "trace"
    if rate is None and arrival != "trace":
        rate = 4.0
    if duration is not None:
        if rate is None:
            raise InputError("--duration: needs --rate", hint="pass --rate N or --requests N")
        count = max(1, round(rate * duration))
    try:
        rates = [float(r) for r in sweep_rates.split(",")] if sweep_rates else None
    except ValueError as exc:
        raise InputError(f"--sweep-rates {sweep_rates}: not a list of numbers", hint="e.g. 1,2,4,8") from exc
    if rates and not all(r > 0 for r in rates):   # a rate of 0 never sends its step's requests
        raise InputError(f"--sweep-rates {sweep_rates}: every rate must be above 0 (requests/s)", hint="e.g. 1,2,4,8")
    traffic = Traffic(arrival=arrival, rate=rate, burstiness=burstiness, requests=count,
                      trace=str(trace) if trace else None, dataset=str(dataset) if dataset else None,
                      output_tokens=output_tokens, seed=seed, warmup=warmup)
    client = ClientOptions(base_url=url, model=model, endpoint=endpoint, stream=stream,  # type: ignore[arg-type]
                           ignore_eos=ignore_eos, max_concurrency=max_concurrency, timeout_s=timeout_s,
                           temperature=temperature)
    report = run_bench([url, *others], traffic, parse_slos(slo_pairs), client, out_dir, do_sweep=do_sweep,
                       sweep_rates=rates, step_duration_s=step_duration,
                       segment=parse_segment(segment) if segment else None, start_at=start_at)
    _show(report, out_dir, as_json)
    # A segment carries 1/N of the traffic: its SLOs are judged on the merged run, not here.
    if not report["passed"] and segment is None:
        raise Blocked("bench: SLOs missed" if not do_sweep else "bench: no swept rate met the SLOs",
                      hint=f"see {out_dir / 'summary.json'}")


@bench_command.command("merge")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--slo", "slo_pairs", multiple=True, metavar="KEY=VALUE",
              help="SLOs to judge the merged run by [default: those the segments ran with]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("relctl-bench-merged"), show_default=True,
              help="folder for the merged records, summary.json and plots")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@handled
def merge_command(folders: tuple[Path, ...], slo_pairs: tuple[str, ...], out_dir: Path, as_json: bool) -> None:
    """Merge the --out folders of every segment of one plan into one summary: percentiles, rates and
    goodput computed from the union of the per-request records, as a single host would report them."""
    from release.serving.loadgen.bench import merge_segments

    report = merge_segments(list(folders), out_dir, parse_slos(slo_pairs) if slo_pairs else None)
    _show(report, out_dir, as_json)
    if not report["passed"]:
        raise Blocked("bench merge: SLOs missed", hint=f"see {out_dir / 'summary.json'}")


def _render(ctx: click.Context, target: Path, segments: int, start_at: float | None, image: str, name: str,
            namespace: str | None, claim: str) -> None:
    from release.serving.loadgen.jobs import render_bench_job

    start = start_at if start_at is not None else float(int(time.time()) + 300)
    text = render_bench_job(explicit_args(ctx, skip=RENDER_OPTIONS | {"start_at"}), segments, start, name=name,
                            image=image, namespace=namespace, results_claim=claim)
    if str(target) == "-":
        click.echo(text, nl=False)
    else:
        target.write_text(text)
        click.echo(f"wrote {target}: {segments} segments starting at {start:.0f} (Unix time); "
                   f"kubectl apply -f {target}", err=True)


def explicit_args(ctx: click.Context, skip: set[str]) -> list[str]:
    """The command line again, from the parameters the user set (so defaults stay the pod's defaults)."""
    out: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if name in skip or ctx.get_parameter_source(name) not in (ParameterSource.COMMANDLINE,
                                                                   ParameterSource.ENVIRONMENT):
            continue
        value = ctx.params[name]
        if isinstance(param, click.Argument):
            out.append(str(value))
        elif isinstance(param, click.Option) and param.is_flag:
            flags = param.opts if value else param.secondary_opts
            out += flags[:1]
        elif isinstance(param, click.Option):
            for item in value if param.multiple else [value]:
                out += [param.opts[0], str(item)]
    return out


def _show(report: dict[str, Any], out_dir: Path, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=2, default=float))
        return
    from rich.console import Console
    from rich.table import Table

    from release.serving.loadgen.bench import side_by_side

    table = Table(title=f"relctl bench ({report['kind']})")
    table.add_column("metric")
    for run in report["runs"]:
        table.add_column(run["label"], justify="right")
    for metric, values in side_by_side(report):
        table.add_row(metric, *values)
    console = Console()
    console.print(table)
    if report["kind"] == "sweep":
        console.print(f"highest rate meeting the SLOs: {report['best_rate']}")
    console.print(f"records, summary.json and plots in {out_dir}")
