"""poolsim command line: a thin typer layer over the library (trace -> sim -> pools -> metrics -> report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Capacity planner for LLM-serving memory: SGLang's pools, radix cache and scheduler, simulated.")


@app.command()
def version() -> None:
    """Print the poolsim version."""
    from importlib.metadata import version as _v

    typer.echo(_v("poolsim"))



def _fail(error: Exception) -> None:
    """Bad input: one line on stderr, exit code 2, nothing written."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(2)


def _gpu(name, memory_gib, bandwidth_tbs, bf16_tflops, fp8_tflops, arch):
    from pools.gpu_catalog import GPUSpec, get_gpu

    if memory_gib is not None:
        return GPUSpec.custom(name or "custom", memory_gib, bandwidth_tbs or 3.35, bf16_tflops or 989.0,
                              fp8_tflops, arch or "sm90")
    if name is None:
        raise ValueError("--gpu is required (a catalog name, or --gpu-memory-gib for a custom GPU)")
    return get_gpu(name)


def _write_atomically(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _compare(model, gpu, args, against, against_tp, overhead, lengths):
    from pools.model_config import ModelConfig
    from pools.sizing import compare_records, crossover_context_len, plan_memory

    plans = {}
    if model.is_hybrid:
        plans[model.name] = plan_memory(model, gpu, args, runtime_overhead_gib=overhead)
        full = model.with_full_attention()
        plans[full.name] = plan_memory(full, gpu, args, runtime_overhead_gib=overhead)
    elif against is None:
        raise ValueError(f"--compare: {model.name} has no linear-attention layers; name a second model with --against")
    else:
        plans[model.name] = plan_memory(model, gpu, args, runtime_overhead_gib=overhead)
    if against is not None:
        other = ModelConfig.load(against)
        other_args = args.replace(tp_size=against_tp or args.tp_size, max_mamba_cache_size=None)
        try:
            plans[f"{other.name} (tp {other_args.tp_size})"] = plan_memory(other, gpu, other_args,
                                                                         runtime_overhead_gib=overhead)
        except ValueError as e:
            raise ValueError(f"--against {against}: {e}") from None
    out = {"records": compare_records(plans, lengths)}
    if model.is_hybrid:
        ratio = plans[model.name].mamba_ratio
        out["crossover_context_len"] = crossover_context_len(model, args)
        out["crossover_context_len_reserved_slots"] = crossover_context_len(model, args, slots=ratio)
    return out


@app.command()
def plan(
    model: str = typer.Option(..., "--model", help="Catalog name (see `poolsim models`) or a config.json path."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Catalog name (see `poolsim gpus`)."),
    tp: int = typer.Option(1, "--tp", "--tp-size"),
    mem_fraction_static: Optional[float] = typer.Option(None, "--mem-fraction-static"),
    page_size: int = typer.Option(1, "--page-size"),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto|bfloat16|fp8_e4m3|fp8_e5m2"),
    context_length: Optional[int] = typer.Option(None, "--context-length"),
    max_running_requests: Optional[int] = typer.Option(None, "--max-running-requests"),
    max_total_tokens: Optional[int] = typer.Option(None, "--max-total-tokens"),
    max_mamba_cache_size: Optional[int] = typer.Option(None, "--max-mamba-cache-size"),
    mamba_ssm_dtype: Optional[str] = typer.Option(None, "--mamba-ssm-dtype", help="float32|bfloat16|float16"),
    mamba_full_memory_ratio: float = typer.Option(0.9, "--mamba-full-memory-ratio"),
    mamba_radix_cache_strategy: str = typer.Option("auto", "--mamba-radix-cache-strategy"),
    chunked_prefill_size: Optional[int] = typer.Option(None, "--chunked-prefill-size"),
    attention_backend: Optional[str] = typer.Option(None, "--attention-backend"),
    disable_radix_cache: bool = typer.Option(False, "--disable-radix-cache"),
    disable_overlap_schedule: bool = typer.Option(False, "--disable-overlap-schedule"),
    runtime_overhead_gib: Optional[float] = typer.Option(
        None, "--runtime-overhead-gib", help="GPU memory taken before weights load (default 1.22 GiB at tp 1, "
        "3.11 GiB above; from SGLang logs)."),
    gpu_memory_gib: Optional[float] = typer.Option(None, "--gpu-memory-gib", help="Custom GPU: memory (GiB)."),
    gpu_bandwidth_tbs: Optional[float] = typer.Option(None, "--gpu-bandwidth-tbs", help="Custom GPU: HBM TB/s."),
    gpu_bf16_tflops: Optional[float] = typer.Option(None, "--gpu-bf16-tflops", help="Custom GPU: dense bf16."),
    gpu_fp8_tflops: Optional[float] = typer.Option(None, "--gpu-fp8-tflops", help="Custom GPU: dense fp8."),
    gpu_arch: Optional[str] = typer.Option(None, "--gpu-arch", help="Custom GPU: sm80|sm89|sm90|sm100|gfx942."),
    concurrency_at: str = typer.Option("1024,8192,32768,131072", "--concurrency-at",
                                       help="Comma-separated context lengths for the concurrency table."),
    compare: bool = typer.Option(False, "--compare", help="Hybrid vs the same model with every layer full attention."),
    against: Optional[str] = typer.Option(None, "--against", help="A second model for --compare."),
    against_tp: Optional[int] = typer.Option(None, "--against-tp"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the --compare plot (PNG) here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """How many KV tokens, request rows and state slots SGLang 0.5.23 allocates, and what fits."""
    from pools.model_config import ModelConfig
    from pools.server_args import ServerArgs
    from pools.sizing import compare_table, max_concurrency, plan_memory

    try:
        lengths = [int(x) for x in concurrency_at.split(",") if x.strip()]
        spec = ModelConfig.load(model)
        card = _gpu(gpu, gpu_memory_gib, gpu_bandwidth_tbs, gpu_bf16_tflops, gpu_fp8_tflops, gpu_arch)
        args = ServerArgs(tp_size=tp, page_size=page_size, mem_fraction_static=mem_fraction_static,
                          kv_cache_dtype=kv_cache_dtype, context_length=context_length,
                          max_running_requests=max_running_requests, max_total_tokens=max_total_tokens,
                          chunked_prefill_size=chunked_prefill_size, disable_radix_cache=disable_radix_cache,
                          disable_overlap_schedule=disable_overlap_schedule, attention_backend=attention_backend,
                          max_mamba_cache_size=max_mamba_cache_size, mamba_ssm_dtype=mamba_ssm_dtype,
                          mamba_full_memory_ratio=mamba_full_memory_ratio,
                          mamba_radix_cache_strategy=mamba_radix_cache_strategy)
        result = plan_memory(spec, card, args, runtime_overhead_gib=runtime_overhead_gib)
        concurrency = max_concurrency(result, lengths)
        comparison = None
        if compare or against or plot:
            compare_lengths = [2**k for k in range(10, 21)]
            comparison = _compare(spec, card, args, against, against_tp, runtime_overhead_gib, compare_lengths)
    except ValueError as e:
        _fail(e)
    if plot is not None:
        from reports.plan_plots import plot_plan_compare

        fig = plot_plan_compare(comparison["records"], comparison.get("crossover_context_len"),
                                title=f"{spec.name} on {card.name}, tp {tp}")
        _write_atomically(plot, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    if as_json:
        out = result.to_dict()
        out["concurrency"] = [c.__dict__ for c in concurrency]
        if comparison is not None:
            out["compare"] = comparison
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(result.table(concurrency))
    if comparison is not None:
        typer.echo("")
        typer.echo(compare_table(comparison["records"]))
        if "crossover_context_len" in comparison:
            typer.echo(f"\nthe fixed state stops costing more than the KV it replaces at "
                       f"{comparison['crossover_context_len']:,} tokens (1 slot per request); "
                       f"{comparison['crossover_context_len_reserved_slots']:,} tokens with the "
                       f"{result.mamba_ratio} slots SGLang reserves per running request")


@app.command()
def models() -> None:
    """The bundled model catalog."""
    from pools.model_config import ModelConfig

    typer.echo(f"{'name':<26} {'architecture':<24} {'layers (attn/linear)':>20} {'params':>9} {'active':>8} "
               f"{'context':>9}  weights")
    for name in ModelConfig.catalog_names():
        m = ModelConfig.load(name)
        layers = f"{len(m.layers)} ({len(m.full_attention_layer_ids)} {m.attention_arch}/" \
                 f"{len(m.linear_layer_ids)} {m.linear_attn.kind if m.linear_attn else '-'})"
        typer.echo(f"{name:<26} {m.architecture:<24} {layers:>20} {m.param_count() / 1e9:>8.1f}B "
                   f"{m.active_param_count() / 1e9:>7.1f}B {m.derived_context_len:>9,}  {m.weight_dtype}")


@app.command()
def gpus() -> None:
    """The bundled GPU catalog (dense FLOP/s)."""
    from pools.gpu_catalog import GPU_CATALOG

    typer.echo(f"{'name':<10} {'model':<16} {'memory':>11} {'HBM':>9} {'bf16':>11} {'fp8':>11}  arch")
    for key, g in GPU_CATALOG.items():
        fp8 = f"{g.fp8_flops / 1e12:,.0f} TF" if g.fp8_flops else "-"
        typer.echo(f"{key:<10} {g.name:<16} {g.total_bytes / 2**30:>7.1f} GiB {g.hbm_bandwidth / 1e12:>5.2f} TB/s "
                   f"{g.bf16_flops / 1e12:>8,.0f} TF {fp8:>11}  {g.arch}")


if __name__ == "__main__":
    app()
