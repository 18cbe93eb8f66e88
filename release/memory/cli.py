"""`relctl plan`: will this package (or config.json, before anything is built) fit the target on a serving
engine, and if not, what would. Every figure is the engine's own plan (`Backend.plan`); this module knows no
engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import click

from release.commands.support import Ctx, emit, handled, json_option
from release.core.errors import InputError

# The plan reads packages through their backends, so the command imports it when it runs, never at
# `relctl --help` (tests/cli/test_startup.py).

KV_DTYPES = ["fp32", "fp16", "bf16", "fp8", "int8"]


def _project_dir() -> Path:
    ctx = click.get_current_context().find_object(Ctx)
    return Path(ctx.project_dir if ctx is not None else ".")


def _check_precision(precision: str) -> None:
    """A precision some installed backend builds (the one source of precisions); the engine checks its own."""
    from release.backends import installed_precisions

    offered = installed_precisions()
    if precision not in offered:
        raise InputError(f"--precision: '{precision}' is not offered by the installed backends",
                         hint=f"use one of {', '.join(offered)}")


def _engine_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """`-o KEY=VALUE` pairs (VALUE read as a YAML scalar: 0.9, 128, true) as the engine's plan options."""
    from release.core.jsonfile import parse_yaml

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--engine-option {pair!r}: expected KEY=VALUE",
                             hint="e.g. -o gpu_memory_utilization=0.9 (relctl plan --help)")
        options[key.strip().replace("-", "_")] = parse_yaml(value, f"--engine-option {key.strip()}",
                                                            hint="VALUE is a YAML scalar: 0.9, 128, true")
    return options


def _options_help() -> str:
    return "An option of the engine's own plan, KEY=VALUE (repeatable); `relctl backends` lists each engine's."


@click.command("plan")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--gpu", "gpu_name", help="GPU name from the catalogue (e.g. H100-80GB, A100-40GB, L4).")
@click.option("--memory-gib", type=float, help="Device memory in GiB, instead of --gpu.")
@click.option("--concurrency", type=int, required=True, help="Concurrent sequences per replica.")
@click.option("--context", type=int, required=True, help="Context tokens per sequence (prompt + output).")
@click.option("--precision", help="Precision to plan, one an installed backend builds (default: the package's).")
@click.option("--gpus", type=int, default=1, show_default=True, help="Devices per replica.")
@click.option("--kv-dtype", type=click.Choice(KV_DTYPES), help="KV cache dtype (default: the model's).")
@click.option("--prefill-tokens", type=int, help="Prompt tokens per sequence in one prefill (default: context).")
@click.option("--headroom", type=float, default=0.10, show_default=True, help="Share of memory kept free.")
@click.option("--provider", type=click.Choice(["cuda", "cpu"]), help="Execution provider (default: cuda with --gpu).")
@click.option("--overlap/--no-overlap", default=None,
              help="Old and new replicas share the devices in a rollout (default: the engine's: relctl serve "
                   "reloads in place; an engine that takes its device share up front starts on new devices).")
@click.option("--engine", help="Serving engine to plan for: any installed backend id (default: the package's "
                               "backend, else release.yaml's convert.backend, else the first installed backend "
                               "that takes the family).")
@click.option("-o", "--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE", help=_options_help())
@click.option("--plot", "plot_file", type=click.Path(path_type=Path), help="Write memory vs concurrency (PNG).")
@json_option
@handled
def plan_command(source: Path, gpu_name: str | None, memory_gib: float | None, concurrency: int, context: int,
                 precision: str | None, gpus: int, kv_dtype: str | None, prefill_tokens: int | None,
                 headroom: float, provider: str | None, overlap: bool | None, engine: str | None,
                 engine_options: tuple[str, ...], plot_file: Path | None, as_json: bool) -> None:
    """Memory plan of SOURCE (a package folder or a Hugging Face config.json) on a target for one serving
    engine, by that engine's own formula: weights, KV cache, activations, overhead and rollout overlap; the
    verdict; the largest concurrency and context that fit. Exit 0 fits, 1 does not fit, 2 bad input."""
    from release.backends import get_backend

    ctx = click.get_current_context().find_object(Ctx)
    if ctx is not None:
        ctx.as_json = as_json
    backend = get_backend(engine or _default_engine(source))
    if precision is not None:
        _check_precision(precision)
    options = _engine_options(engine_options)
    resolved_provider = provider or ("cuda" if gpu_name else "cpu")
    target = _target(gpu_name, memory_gib, concurrency, context, gpus, kv_dtype, prefill_tokens, headroom,
                     resolved_provider, overlap if overlap is not None else backend.rollout_shares_devices)
    plan = backend.plan(source, target, precision=precision, settings=options)
    data = plan.to_dict()
    if plot_file is not None:
        drawn = backend.plot_plan(plan, plot_file)
        if drawn is None:
            raise InputError(f"--plot: the {backend.id} plan has no plot", hint="drop --plot")
        data["plot"] = str(drawn)
    lines = backend.plan_lines(plan) + ([f"plot: {data['plot']}"] if "plot" in data else [])
    emit(data, as_json, lambda: click.echo("\n".join(lines)))
    if not plan.fits:
        raise SystemExit(1)


def _target(gpu_name: str | None, memory_gib: float | None, concurrency: int, context: int, gpus: int,
            kv_dtype: str | None, prefill_tokens: int | None, headroom: float, provider: str,
            overlap: bool) -> Any:
    from release.backends.planning import Target
    from release.backends.shape import Provider

    if (gpu_name is None) == (memory_gib is None):
        raise InputError("give exactly one of --gpu NAME or --memory-gib SIZE",
                         hint="e.g. --gpu H100-80GB, or --memory-gib 80")
    name, price = None, None
    if gpu_name is not None:
        from release.memory.catalogue import find_gpu, load_catalogue
        from release.memory.settings import project_catalogue

        gpu = find_gpu(gpu_name, load_catalogue(project_catalogue(_project_dir() / "release.yaml")))
        name, memory_gib, price = gpu.name, gpu.memory_gib, gpu.price_per_hour
    assert memory_gib is not None
    return Target(memory_gib=memory_gib, concurrency=concurrency, context=context, gpus=gpus,
                  provider=cast(Provider, provider), kv_dtype=kv_dtype, prefill_tokens=prefill_tokens,
                  headroom=headroom, rollout_overlap=overlap, gpu_name=name, price_per_hour=price)


def _default_engine(source: Path) -> str:
    """The package's backend; for a config.json, release.yaml's convert.backend when it names one, else the
    first installed backend that takes the family (auto's rule), else the first installed one."""
    from release.backends import AUTO, available_backends

    if source.is_dir():
        from release.backends.package_facts import read_package

        return read_package(source).backend
    config_file = _project_dir() / "release.yaml"
    if config_file.is_file():
        from release.core.jsonfile import load_yaml

        data = load_yaml(config_file, hint="fix release.yaml (relctl init writes a valid one)",
                         label=str(config_file)) or {}
        convert = data.get("convert") if isinstance(data, dict) else None
        chosen = convert.get("backend") if isinstance(convert, dict) else None
        if isinstance(chosen, str) and chosen != AUTO:
            return chosen
    from release.backends.package_facts import read_config_file
    from release.backends.shape import shape_from_config

    config = read_config_file(source)
    shape_from_config(config, source.name)  # an architecture no plan knows is refused as such, by any engine
    installed = list(available_backends().values())
    if not installed:
        raise InputError("no serving backend is installed", hint="install relctl with its built-in backends")
    # None taking the family (a MoE no engine here builds): the first installed engine's plan still says
    # what the weights and KV cache would need.
    return next((b.id for b in installed if b.supports(config).supported), installed[0].id)
