"""Click commands `serve` and `bench`; the relctl CLI attaches them with `cli.add_command(...)`.

No logic here: parse options, call release.serving.api, print.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from release.errors import EXIT_INTERRUPTED, ReleaseError

F = TypeVar("F", bound=Callable[..., Any])


def _relctl_ctx() -> Any:
    """The relctl group's context object when these commands run under `relctl`, else None."""
    from release.cli_support import Ctx

    return click.get_current_context().find_object(Ctx)


def _handled(fn: F) -> F:
    """Under `relctl`, failures become relctl's one error line and exit code (release.cli_support);
    standalone (`python -m release.serving`), main() below does the same."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except (ReleaseError, KeyboardInterrupt, Exception) as exc:
            ctx = _relctl_ctx()
            if ctx is None:
                raise
            from release.cli_support import _fail

            _fail(ctx, exc)

    return wrapper  # type: ignore[return-value]


def _project_dir(option: Path | None) -> Path:
    """--project-dir, else the relctl group's project folder, else the current directory."""
    if option is not None:
        return option.resolve()
    ctx = _relctl_ctx()
    return Path(ctx.project_dir if ctx is not None else ".").resolve()


@click.command("serve")
@click.argument("spec", metavar="MODEL@ALIAS|PACKAGE_DIR")
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="port to listen on (0: any free port)")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="release.yaml whose serving.server block replaces the package's server settings")
@click.option("--project-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="project folder: MLflow store, package cache and request logs [default: relctl's, else .]")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write {url, pid, model, load_time_s} as JSON here once listening")
@_handled
def serve_command(spec: str, host: str, port: int, config_path: Path | None, project_dir: Path | None,
                  ready_file: Path | None) -> None:
    """Serve a package (verified first) as an OpenAI-compatible API: /v1/completions,
    /v1/chat/completions, /v1/models, /health, /metrics. Ctrl-C or SIGTERM drains in-flight requests."""
    from release.serving.api import serve

    def announce(info: dict[str, Any]) -> None:
        click.echo(f"serving {info['model']} (serving config {info['serving_config']}) at {info['url']}; "
                   f"model loaded in {info['load_time_s']:.2f}s", err=True)

    serve(spec, host=host, port=port, project_dir=_project_dir(project_dir), config_path=config_path,
          ready_file=ready_file, on_ready=announce)


def _parse_slos(pairs: tuple[str, ...]) -> Any:
    from pydantic import ValidationError

    from release.errors import InputError
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


@click.command("bench")
@click.argument("url")
@click.option("--compare", "others", multiple=True, help="another endpoint to run the same traffic against (repeat)")
@click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant", "trace"]), default="poisson",
              show_default=True, help="arrival process of the planned send times")
@click.option("--rate", type=float, default=None, help="requests/s (trace: rescale to it) [default: 4]")
@click.option("--burstiness", type=float, default=1.0, show_default=True, help="Gamma shape; < 1 is burstier")
@click.option("--requests", "count", type=click.IntRange(1), default=100, show_default=True,
              help="requests to send")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="seconds of traffic: sets --requests to rate x duration")
@click.option("--trace", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSONL trace with a 'timestamp' per row (with --arrival trace)")
@click.option("--dataset", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSONL of {prompt|messages, output_tokens} to draw requests from [default: synthetic]")
@click.option("--output-tokens", type=click.IntRange(1), default=32, show_default=True,
              help="output length for rows without output_tokens")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="/v1/completions or /v1/chat/completions")
@click.option("--model", default=None, help="model field to send [default: the endpoint's first /v1/models id]")
@click.option("--max-concurrency", type=click.IntRange(1), default=None,
              help="cap on requests in flight; waiting time is reported as client queue time")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True, help="per-request timeout (s)")
@click.option("--stream/--no-stream", default=True, show_default=True, help="SSE streaming (needed for TTFT/ITL)")
@click.option("--ignore-eos/--respect-eos", default=True, show_default=True,
              help="ask for exactly output_tokens tokens (vLLM's ignore_eos)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of arrivals and sampled rows")
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True, help="unrecorded warm-up requests")
@click.option("--slo", "slo_pairs", multiple=True, metavar="KEY=VALUE",
              help="SLO, e.g. ttft_p99_ms=500, tpot_p95_ms=50, max_error_rate=0.01, request_ttft_ms=800")
@click.option("--sweep", "do_sweep", is_flag=True, help="find the highest rate that meets the SLOs")
@click.option("--sweep-rates", default=None, help="comma-separated rates to try instead of doubling + bisection")
@click.option("--step-duration", type=float, default=10.0, show_default=True, help="seconds per sweep step")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("relctl-bench"),
              show_default=True, help="folder for records-*.jsonl, summary.json and plots")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@_handled
def bench_command(url: str, others: tuple[str, ...], arrival: str, rate: float | None, burstiness: float,
                  count: int, duration: float | None, trace: Path | None, dataset: Path | None,
                  output_tokens: int, endpoint: str, model: str | None, max_concurrency: int | None,
                  timeout_s: float, stream: bool, ignore_eos: bool, seed: int, warmup: int,
                  slo_pairs: tuple[str, ...], do_sweep: bool, sweep_rates: str | None, step_duration: float,
                  out_dir: Path, as_json: bool) -> None:
    """Open-loop load test of any OpenAI-compatible endpoint: TTFT, TPOT, ITL, E2EL, throughput,
    goodput, errors; --compare endpoints side by side, or --sweep for the highest SLO-meeting rate.
    Exits 1 when an SLO is missed."""
    import json

    from release.errors import Blocked, InputError
    from release.serving.api import bench
    from release.serving.loadgen.runner import Traffic

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
    traffic = Traffic(arrival=arrival, rate=rate, burstiness=burstiness, requests=count,
                      trace=str(trace) if trace else None, dataset=str(dataset) if dataset else None,
                      output_tokens=output_tokens, seed=seed, warmup=warmup)
    report = bench([url, *others], traffic=traffic, slos=_parse_slos(slo_pairs), out_dir=out_dir,
                   endpoint=endpoint, model=model, stream=stream,  # type: ignore[arg-type]
                   ignore_eos=ignore_eos, max_concurrency=max_concurrency, timeout_s=timeout_s,
                   sweep=do_sweep, sweep_rates=rates, step_duration_s=step_duration)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=float))
    else:
        _print_table(report, out_dir)
    if not report["passed"]:
        raise Blocked("bench: SLOs missed" if not do_sweep else "bench: no swept rate met the SLOs",
                      hint=f"see {out_dir / 'summary.json'}")


def _print_table(report: dict[str, Any], out_dir: Path) -> None:
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


@click.group("serving")
def serving_group() -> None:
    """Serving commands: serve a package, benchmark an endpoint."""


serving_group.add_command(serve_command)
serving_group.add_command(bench_command)


def main() -> None:
    """Entry point of `python -m release.serving`: one-line errors and relctl's exit codes."""
    try:
        serving_group.main(standalone_mode=False)
    except ReleaseError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except (KeyboardInterrupt, click.Abort):
        sys.exit(EXIT_INTERRUPTED)
