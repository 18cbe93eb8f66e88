"""`relctl plan`: will this package (or config.json, before anything is built) fit the target, and if not,
what would."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from release.commands.support import Ctx, emit, handled, json_option
from release.core.errors import InputError
from release.core.units import size
from release.memory.plan import KV_DTYPE_BYTES, Target, check_context, parameters
from release.memory.shape import PRECISIONS, Precision, Provider

# plan.py and shape.py above are plain Python (the formula and the choices); the rest reads packages with
# onnx, so the command imports it when it runs, never `relctl --help` (tests/cli/test_startup.py).

if TYPE_CHECKING:
    from release.memory.verdict import MemoryPlan


def _project_dir() -> Path:
    ctx = click.get_current_context().find_object(Ctx)
    return Path(ctx.project_dir if ctx is not None else ".")


def _check_precision(precision: str) -> None:
    """A precision some installed backend builds (the one source of precisions) that the plan can lay out."""
    from release.backends import installed_precisions

    offered = installed_precisions()
    if precision not in offered:
        raise InputError(f"--precision: '{precision}' is not offered by the installed backends",
                         hint=f"use one of {', '.join(offered)}")
    if precision not in PRECISIONS:
        raise InputError(f"--precision: the memory plan cannot lay out {precision} weights yet",
                         hint=f"plan one of {', '.join(PRECISIONS)}")


@click.command("plan")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--gpu", "gpu_name", help="GPU name from the catalogue (e.g. H100-80GB, A100-40GB, L4).")
@click.option("--memory-gib", type=float, help="Device memory in GiB, instead of --gpu.")
@click.option("--concurrency", type=int, required=True, help="Concurrent sequences per replica.")
@click.option("--context", type=int, required=True, help="Context tokens per sequence (prompt + output).")
@click.option("--precision", help="Precision to plan, one an installed backend builds (default: the package's; fp16).")
@click.option("--gpus", type=int, default=1, show_default=True, help="Devices per replica.")
@click.option("--kv-dtype", type=click.Choice(list(KV_DTYPE_BYTES)), help="KV cache dtype (default: the model's).")
@click.option("--prefill-tokens", type=int, help="Prompt tokens per sequence in one prefill (default: context).")
@click.option("--headroom", type=float, default=0.10, show_default=True, help="Share of memory kept free.")
@click.option("--provider", type=click.Choice(["cuda", "cpu"]), help="Execution provider (default: cuda with --gpu).")
@click.option("--no-overlap", is_flag=True, help="Old and new replicas do not share the devices in a rollout.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path), help="Write memory vs concurrency (PNG).")
@json_option
@handled
def plan_command(source: Path, gpu_name: str | None, memory_gib: float | None, concurrency: int, context: int,
                 precision: str | None, gpus: int, kv_dtype: str | None, prefill_tokens: int | None,
                 headroom: float, provider: str | None, no_overlap: bool, plot_file: Path | None,
                 as_json: bool) -> None:
    """Memory plan of SOURCE (a package folder or a Hugging Face config.json) on a target: weights, KV
    cache, workspace, overhead and rollout overlap; the verdict; the largest concurrency and context that
    fit; the precision that fits. Exit 0 fits, 1 does not fit, 2 bad input."""
    from release.memory.verdict import load_spec, make_plan

    ctx = click.get_current_context().find_object(Ctx)
    if ctx is not None:
        ctx.as_json = as_json
    if precision is not None:
        _check_precision(precision)
    target = _target(gpu_name, memory_gib, concurrency, context, gpus, kv_dtype, prefill_tokens, headroom,
                     cast(Provider, provider or ("cuda" if gpu_name else "cpu")), not no_overlap)
    spec = load_spec(source, cast(Precision | None, precision), target.provider)
    check_context(spec.shape, target.context)
    plan = make_plan(spec, target)
    data = plan.to_dict()
    if plot_file is not None:
        from release.memory.plot import plot_plan

        data["plot"] = str(plot_plan(plan, plot_file))
    emit(data, as_json, lambda: _print(plan, data.get("plot")))
    if not plan.fits:
        raise SystemExit(1)


def _target(gpu_name: str | None, memory_gib: float | None, concurrency: int, context: int, gpus: int,
            kv_dtype: str | None, prefill_tokens: int | None, headroom: float, provider: Provider,
            overlap: bool) -> Target:
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
    return Target(memory_gib=memory_gib, concurrency=concurrency, context=context, gpus=gpus, provider=provider,
                  kv_dtype=kv_dtype, prefill_tokens=prefill_tokens, headroom=headroom, rollout_overlap=overlap,
                  gpu_name=name, price_per_hour=price)


def _gib(value: int) -> str:
    return size(value, width=9)


def _model_line(plan: MemoryPlan) -> str:
    """The architecture facts the figures rest on: parameters (active ones for MoE) and KV per token."""
    s, b = plan.spec.shape, plan.breakdown
    total, active = parameters(plan.spec), parameters(plan.spec, active=True)
    params = f"{s.family}, {total:,} parameters" + (
        f" ({active:,} active: {s.experts_per_token} of {s.experts} experts)" if active != total else "")
    kv = f"KV {b.kv_bytes_per_token:,} bytes/token" + (" (MLA latent)" if s.mla else "")
    if s.window_cache_layers:
        kv += (f"; {s.window_cache_layers} of {s.layers} layers cache at most {s.sliding_window:,} tokens "
               f"({b.kv_bytes_per_token_beyond_window:,} bytes/token beyond them)")
    elif s.sliding_layers:
        kv += (f"; attention slides over {s.sliding_window:,} tokens but the cache holds the whole context "
               "(onnxruntime-genai bounds only layer_types' sliding layers)")
    return f"{params}; {kv}"


def _print(plan: MemoryPlan, plot: Any) -> None:
    b, t = plan.breakdown, plan.target
    source = "the package" if plan.spec.weights_source == "package" else "config.json"
    device = t.gpu_name or f"{t.memory_gib:g} GiB"
    click.echo(f"{plan.spec.precision} weights from {source}, {t.concurrency} x {t.context} tokens "
               f"on {t.gpus} x {device}")
    click.echo(f"  {_model_line(plan)}")
    for label, value in (("weights", b.weights), ("KV cache", b.kv_cache), ("workspace", b.workspace),
                         ("overhead", b.overhead), ("rollout overlap", b.overlap), ("peak", b.peak),
                         ("budget", b.budget), ("capacity", b.capacity), ("headroom", b.headroom_bytes)):
        click.echo(f"  {label:16s}{_gib(value)}")
    click.echo(("✓ " if plan.fits else "✗ ") + plan.summary())
    if t.prefill_tokens is None and b.workspace > b.kv_cache:
        click.echo(f"  note: the workspace assumes all {t.concurrency} sequences prefill {t.context} tokens at once "
                   "(onnxruntime-genai's batch); --prefill-tokens plans shorter prompts")
    for alt in plan.alternatives:
        click.echo(f"  {alt.precision:5s} {'fits' if alt.fits else 'no  '}  peak {size(alt.peak_bytes, width=9)}, "
                   f"max concurrency {alt.max_concurrency} at {t.context}, max context {alt.max_context} "
                   f"at {t.concurrency}")
    if plot:
        click.echo(f"plot: {plot}")
