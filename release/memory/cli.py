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

ENGINES = ["onnxruntime-genai", "vllm"]

# plan.py and shape.py above are plain Python (the formula and the choices); the rest reads packages with
# onnx, so the command imports it when it runs, never `relctl --help` (tests/cli/test_startup.py).

if TYPE_CHECKING:
    from release.memory.verdict import MemoryPlan
    from release.memory.vllm_plan import VllmPlan


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
@click.option("--overlap/--no-overlap", default=None,
              help="Old and new replicas share the devices in a rollout (default: onnxruntime-genai yes; vLLM no, "
                   "a new replica on its own devices).")
@click.option("--engine", type=click.Choice(ENGINES),
              help="Serving engine to plan for (default: the package's backend, else release.yaml's "
                   "convert.backend, else onnxruntime-genai).")
@click.option("--gpu-memory-utilization", type=float, help="vLLM: share of the device it takes (default 0.92).")
@click.option("--max-num-batched-tokens", type=int, help="vLLM: chunked-prefill token budget (default: vLLM's).")
@click.option("--max-num-seqs", type=int, help="vLLM: most sequences scheduled at once (default: vLLM's).")
@click.option("--block-size", type=int, help="vLLM: tokens per KV block (default 16 on GPU, 128 on CPU).")
@click.option("--kv-cache-gib", type=float,
              help="vLLM: explicit KV pool (default on CPU: RELCTL_VLLM_KVCACHE_GIB, as relctl starts vLLM).")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path), help="Write memory vs concurrency (PNG).")
@json_option
@handled
def plan_command(source: Path, gpu_name: str | None, memory_gib: float | None, concurrency: int, context: int,
                 precision: str | None, gpus: int, kv_dtype: str | None, prefill_tokens: int | None,
                 headroom: float, provider: str | None, overlap: bool | None, engine: str | None,
                 gpu_memory_utilization: float | None, max_num_batched_tokens: int | None,
                 max_num_seqs: int | None, block_size: int | None, kv_cache_gib: float | None,
                 plot_file: Path | None, as_json: bool) -> None:
    """Memory plan of SOURCE (a package folder or a Hugging Face config.json) on a target for one serving
    engine: weights, KV cache, workspace, overhead and rollout overlap; the verdict; the largest concurrency
    and context that fit; for onnxruntime-genai the precision that fits, for vLLM the KV capacity and
    concurrency it would log at start-up. Exit 0 fits, 1 does not fit, 2 bad input."""
    from release.memory.verdict import load_spec, make_plan

    ctx = click.get_current_context().find_object(Ctx)
    if ctx is not None:
        ctx.as_json = as_json
    engine = engine or _default_engine(source)
    vllm_options = {"--gpu-memory-utilization": gpu_memory_utilization, "--max-num-batched-tokens":
                    max_num_batched_tokens, "--max-num-seqs": max_num_seqs, "--block-size": block_size,
                    "--kv-cache-gib": kv_cache_gib}
    given = [name for name, value in vllm_options.items() if value is not None]
    if engine != "vllm" and given:
        raise InputError(f"{given[0]} is a vLLM setting, and this plan is for {engine}",
                         hint="add --engine vllm, or drop the option")
    if precision is not None and engine != "vllm":
        _check_precision(precision)
    resolved_provider = cast(Provider, provider or ("cuda" if gpu_name else "cpu"))
    target = _target(gpu_name, memory_gib, concurrency, context, gpus, kv_dtype, prefill_tokens, headroom,
                     resolved_provider, overlap if overlap is not None else engine != "vllm")
    if engine == "vllm":
        if plot_file is not None:
            raise InputError("--plot draws the onnxruntime-genai plan only", hint="drop --plot with --engine vllm")
        _plan_vllm(source, precision, target, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                   block_size, kv_cache_gib, as_json)
        return
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


def _default_engine(source: Path) -> str:
    """The package's backend; for a config.json, release.yaml's convert.backend when it names vllm."""
    if source.is_dir():
        from release.memory.package import read_package

        return "vllm" if read_package(source).backend == "vllm" else "onnxruntime-genai"
    config_file = _project_dir() / "release.yaml"
    if config_file.is_file():
        import yaml

        data = yaml.safe_load(config_file.read_text()) or {}
        convert = data.get("convert") if isinstance(data, dict) else None
        if isinstance(convert, dict) and convert.get("backend") == "vllm":
            return "vllm"
    return "onnxruntime-genai"


def _plan_vllm(source: Path, precision: str | None, target: Target, utilization: float | None,
               batched: int | None, seqs: int | None, block: int | None, kv_gib: float | None,
               as_json: bool) -> None:
    from release.memory.plan import GIB
    from release.memory.vllm_plan import GPU_MEMORY_UTILIZATION, VllmSettings, load_spec, make_plan

    if kv_gib is None and target.provider == "cpu":
        from release.backends.vllm.engine import kv_cache_space_gib

        kv_gib = kv_cache_space_gib()  # what relctl starts vLLM with on CPU (VLLM_CPU_KVCACHE_SPACE)
    if kv_gib is not None and not kv_gib > 0:
        raise InputError(f"--kv-cache-gib: {kv_gib} is not positive", hint="e.g. --kv-cache-gib 1")
    settings = VllmSettings(gpu_memory_utilization=utilization or GPU_MEMORY_UTILIZATION, block_size=block,
                            max_num_batched_tokens=batched, max_num_seqs=seqs,
                            kv_cache_bytes=int(kv_gib * GIB) if kv_gib is not None else None)
    plan = make_plan(load_spec(source, precision, target.provider), target, settings)
    emit(plan.to_dict(), as_json, lambda: _print_vllm(plan))
    if not plan.fits:
        raise SystemExit(1)


def _print_vllm(plan: VllmPlan) -> None:
    b, t, s = plan.breakdown, plan.target, plan.spec
    source = "the package" if s.weights_source == "package" else "config.json"
    device = t.gpu_name or f"{t.memory_gib:g} GiB"
    share = (f"gpu_memory_utilization {plan.settings.gpu_memory_utilization:g}" if plan.settings.kv_cache_bytes is None
             else f"explicit KV pool {size(plan.settings.kv_cache_bytes)}")
    click.echo(f"vLLM: {s.precision} weights from {source}, {t.concurrency} x {t.context:,} tokens on {t.gpus} x "
               f"{device} ({share})")
    click.echo(f"  {s.shape.family}, {parameters_of(plan):,} parameters; KV {b.kv_bytes_per_token:,} bytes/token"
               f"{' (MLA latent)' if s.shape.mla else ''}; blocks of {b.block_size} tokens "
               f"({b.page_bytes:,} bytes); chunked prefill {plan.batched_tokens:,} tokens, "
               f"max_num_seqs {plan.max_num_seqs}")
    rows = (("weights", b.weights), ("activations", b.activations), ("CUDA graphs", b.cuda_graphs),
            ("overhead", b.overhead), ("KV pool", b.kv_pool), ("KV needed", b.kv_needed),
            ("KV headroom", b.kv_headroom), ("rollout overlap", b.overlap), ("budget", b.budget),
            ("capacity", b.capacity), ("headroom", b.headroom_bytes))
    for label, value in rows:
        click.echo(f"  {label:16s}{_gib(value)}")
    click.echo(f"  as vLLM logs it: {plan.log_line()}")
    click.echo(("✓ " if plan.fits else "✗ ") + plan.summary())
    click.echo("  note: CUDA graphs are a stated allowance (vLLM profiles them at start-up)"
               if t.provider == "cuda" else "  note: on CPU the KV pool is VLLM_CPU_KVCACHE_SPACE, taken whole")


def parameters_of(plan: VllmPlan) -> int:
    from release.memory.shape import parameter_count

    return parameter_count(plan.spec.shape)
