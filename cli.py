"""poolsim command line: a thin typer layer over the library (trace -> sim -> pools -> metrics -> report)."""

from __future__ import annotations

import functools
import inspect
import json
import math
import typing
from contextlib import contextmanager
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


# SGLang server flags shared by every command that builds a server: name -> (type, typer.Option).
SERVER_OPTIONS = {
    "model": (str, typer.Option(..., "--model", help="Catalog name (see `poolsim models`) or a config.json path.")),
    "gpu": (Optional[str], typer.Option(None, "--gpu", help="Catalog name (see `poolsim gpus`).")),
    "tp": (int, typer.Option(1, "--tp", "--tp-size")),
    "dp": (int, typer.Option(1, "--dp", "--dp-size", help="Data-parallel replicas (each with tp GPUs).")),
    "mem_fraction_static": (Optional[float], typer.Option(None, "--mem-fraction-static")),
    "page_size": (int, typer.Option(1, "--page-size")),
    "kv_cache_dtype": (str, typer.Option("auto", "--kv-cache-dtype", help="auto|bfloat16|fp8_e4m3|fp8_e5m2")),
    "context_length": (Optional[int], typer.Option(None, "--context-length")),
    "max_running_requests": (Optional[int], typer.Option(None, "--max-running-requests")),
    "max_total_tokens": (Optional[int], typer.Option(None, "--max-total-tokens")),
    "max_prefill_tokens": (int, typer.Option(16384, "--max-prefill-tokens")),
    "chunked_prefill_size": (Optional[int], typer.Option(None, "--chunked-prefill-size",
                                                         help="-1 disables chunking; unset: SGLang's default.")),
    "schedule_policy": (str, typer.Option("fcfs", "--schedule-policy", help="fcfs|lpm")),
    "schedule_conservativeness": (float, typer.Option(1.0, "--schedule-conservativeness")),
    "max_mamba_cache_size": (Optional[int], typer.Option(None, "--max-mamba-cache-size")),
    "mamba_ssm_dtype": (Optional[str], typer.Option(None, "--mamba-ssm-dtype", help="float32|bfloat16|float16")),
    "mamba_full_memory_ratio": (float, typer.Option(0.9, "--mamba-full-memory-ratio")),
    "mamba_radix_cache_strategy": (str, typer.Option("auto", "--mamba-radix-cache-strategy")),
    "attention_backend": (Optional[str], typer.Option(None, "--attention-backend")),
    "disable_radix_cache": (bool, typer.Option(False, "--disable-radix-cache")),
    "disable_overlap_schedule": (bool, typer.Option(False, "--disable-overlap-schedule")),
    "enable_mixed_chunk": (bool, typer.Option(False, "--enable-mixed-chunk")),
    "runtime_overhead_gib": (Optional[float], typer.Option(
        None, "--runtime-overhead-gib", help="GPU memory taken before weights load (default 1.22 GiB at tp 1, "
        "3.11 GiB above; from SGLang logs).")),
    "gpu_memory_gib": (Optional[float], typer.Option(None, "--gpu-memory-gib", help="Custom GPU: memory (GiB).")),
    "gpu_bandwidth_tbs": (Optional[float], typer.Option(None, "--gpu-bandwidth-tbs", help="Custom GPU: HBM TB/s.")),
    "gpu_bf16_tflops": (Optional[float], typer.Option(None, "--gpu-bf16-tflops", help="Custom GPU: dense bf16.")),
    "gpu_fp8_tflops": (Optional[float], typer.Option(None, "--gpu-fp8-tflops", help="Custom GPU: dense fp8.")),
    "gpu_arch": (Optional[str], typer.Option(None, "--gpu-arch", help="Custom GPU: sm80|sm89|sm90|sm100|gfx942.")),
}


def with_server_options(command):
    """Give a command every SGLang server flag; it receives them as one dict, ``server``."""
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "server"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind)
             for name, (kind, opt) in SERVER_OPTIONS.items()]
    hints = typing.get_type_hints(command)

    @functools.wraps(command)
    def wrapper(**kwargs):
        server = {name: kwargs.pop(name) for name in SERVER_OPTIONS}
        return command(server=server, **kwargs)

    wrapper.__signature__ = inspect.Signature(
        [p.replace(annotation=hints.get(p.name, p.annotation)) for p in own] + extra)
    wrapper.__annotations__ = {**{p.name: hints.get(p.name) for p in own}, **{n: k for n, (k, _) in SERVER_OPTIONS.items()}}
    del wrapper.__wrapped__  # typer must see the new signature, not the original's
    return wrapper


def _server(server: dict):
    """(ModelConfig, GPUSpec, ServerArgs, runtime_overhead_gib) from the shared flags."""
    from pools.model_config import ModelConfig
    from pools.server_args import ServerArgs

    s = dict(server)
    model = ModelConfig.load(s.pop("model"))
    gpu = _gpu(s.pop("gpu"), s.pop("gpu_memory_gib"), s.pop("gpu_bandwidth_tbs"), s.pop("gpu_bf16_tflops"),
               s.pop("gpu_fp8_tflops"), s.pop("gpu_arch"))
    overhead = s.pop("runtime_overhead_gib")
    s["tp_size"], s["dp_size"] = s.pop("tp"), s.pop("dp")
    if s["dp_size"] < 1:
        raise ValueError(f"--dp {s['dp_size']}: must be >= 1")
    return model, gpu, ServerArgs(**s), overhead


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
@with_server_options
def plan(
    server: dict,
    concurrency_at: str = typer.Option("1024,8192,32768,131072", "--concurrency-at",
                                       help="Comma-separated context lengths for the concurrency table."),
    compare: bool = typer.Option(False, "--compare", help="Hybrid vs the same model with every layer full attention."),
    against: Optional[str] = typer.Option(None, "--against", help="A second model for --compare."),
    against_tp: Optional[int] = typer.Option(None, "--against-tp"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the --compare plot (PNG) here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """How many KV tokens, request rows and state slots SGLang 0.5.23 allocates, and what fits."""
    from pools.sizing import compare_table, max_concurrency, plan_memory

    try:
        lengths = [int(x) for x in concurrency_at.split(",") if x.strip()]
        spec, card, args, runtime_overhead_gib = _server(server)
        tp = args.tp_size
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


def _load_trace(path: Optional[Path], fmt: Optional[str], skip_bad_lines: bool):
    from traces import DEFAULT_TRACE, load_trace

    return load_trace(path or DEFAULT_TRACE, format=fmt, skip_bad_lines=skip_bad_lines)


def _progress(total: int, quiet: bool, unit: str = "requests"):
    """A rich progress bar over finished requests (or sweep configurations); the callback and the context to
    close it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if quiet:
        return None, None
    sim_time = [TextColumn("sim t={task.fields[t]:.1f} s")] if unit == "requests" else []
    bar = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                   *sim_time, TimeElapsedColumn(), transient=True)
    task = bar.add_task("run", total=total, t=0.0)
    return (lambda done, t: bar.update(task, completed=done, t=t)), bar


def _simulate(trace, server: dict, opts: dict, trace_info: dict, quiet: bool):
    from sim.run import simulate

    model, gpu, args, overhead = _server(server)
    callback, bar = _progress(trace_info.get("requests") or 0, quiet)
    if bar is not None:
        bar.start()
    try:
        return simulate(trace, model, gpu, args, trace_info=trace_info, runtime_overhead_gib=overhead,
                        progress=callback, **opts)
    finally:
        if bar is not None:
            bar.stop()


def _summary_rows(summary: dict) -> list[tuple[str, str]]:
    def ms(x):
        return "-" if x is None else f"{x * 1e3:,.0f} ms" if x < 10 else f"{x:,.1f} s"

    pools = summary["pools"]
    rows = [
        ("requests (finished / aborted)", f"{summary['finished']:,} / {summary['aborted']:,}"),
        ("retractions (requests)", f"{summary['retractions']:,} ({summary['retracted_requests']:,})"),
        ("simulated duration", f"{summary['duration_s']:,.1f} s over {summary['steps']:,} steps"),
        ("throughput", f"{summary['throughput_req_s']:,.2f} req/s, {summary['output_tok_s']:,.0f} output tok/s, "
                       f"{summary['input_tok_s']:,.0f} input tok/s"),
        ("TTFT p50 / p90 / p99", " / ".join(ms(summary["ttft_s"][k]) for k in ("p50", "p90", "p99"))),
        ("inter-token p50 / p90 / p99", " / ".join(ms(summary["itl_s"][k]) for k in ("p50", "p90", "p99"))),
        ("end-to-end p50 / p90 / p99", " / ".join(ms(summary["e2e_s"][k]) for k in ("p50", "p90", "p99"))),
        ("prefix-cache hit rate", f"{summary['cache_hit_rate']:.1%} of prefill tokens"),
    ]
    for name, label in (("kv", "KV tokens"), ("rows", "request rows"), ("mamba", "mamba slots")):
        if name in pools:
            p = pools[name]
            rows.append((f"{label} (capacity {p['capacity']:,})",
                         f"peak {p['peak_used_frac']:.0%}, mean {p['mean_used_frac']:.0%}"
                         + (f", first exhausted at t={p['first_exhausted_s']:.1f} s" if p["first_exhausted_s"]
                            is not None else "")))
    return rows


def _print_summaries(labels: list[str], summaries: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=len(labels) > 1, box=None)
    table.add_column("metric", style="bold")
    for label in labels:
        table.add_column(label)
    rows = [_summary_rows(s) for s in summaries]
    for i, (name, _) in enumerate(rows[0]):
        table.add_row(name, *(r[i][1] if i < len(r) else "-" for r in rows))
    console = Console()
    console.print(table)
    for label, s in zip(labels, summaries):
        console.print(f"[bold]{label}:[/bold] {s['verdict']}" if len(labels) > 1 else s["verdict"])


@app.command()
@with_server_options
def run(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file (any supported format); default: the bundled trace."),
    fmt: Optional[str] = typer.Option(None, "--format", help="mooncake|azure|sharegpt|tokens|poolsim (default: detect)."),
    skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines", help="Skip malformed trace lines, report how many."),
    seed: int = typer.Option(0, "--seed", help="Recorded with the run; the simulation itself is deterministic."),
    max_new_tokens: str = typer.Option("trace", "--max-new-tokens-policy",
                                       help="trace (max_new_tokens = the trace's, else its output length), "
                                            "ignore_eos, or fixed:N (clients ask N; generation stops at the "
                                            "trace's output length)."),
    router: str = typer.Option("round_robin", "--router", help="dp router: round_robin|cache_aware."),
    step_time: str = typer.Option("analytic", "--step-time", help="analytic, or fixed:MILLISECONDS."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Step-time coefficients (JSON)."),
    compare_model: Optional[str] = typer.Option(None, "--compare-model",
                                                help="Run the same trace through a second model, side by side."),
    compare_tp: Optional[int] = typer.Option(None, "--compare-tp", help="tp for --compare-model (default: --tp)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write frames, summary and the HTML report here."),
    check: bool = typer.Option(False, "--check", help="Debug: check every pool's invariants at every step."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (or both) as one JSON object."),
) -> None:
    """Replay a trace through SGLang's scheduler and pools: retractions, aborts, cache hits, latency."""
    from pools.errors import PoolError
    from sim.output import write_run

    opts = dict(seed=seed, max_new_tokens=max_new_tokens, router=router, step_time=step_time,
                calibration=str(calibration) if calibration else None, check=check)
    try:
        loaded = _load_trace(trace, fmt, skip_bad_lines)
        info = {"path": str(loaded.source_path or trace or ""), "name": loaded.name, "format": loaded.format,
                "requests": len(loaded), "skipped_lines": loaded.skipped_lines}
        results = [("primary", _simulate(loaded, server, opts, info, quiet or as_json))]
        if compare_model:
            other = dict(server, model=compare_model, tp=compare_tp or server["tp"], max_mamba_cache_size=None)
            results.append(("compare", _simulate(loaded, other, opts, info, quiet or as_json)))
    except (ValueError, OSError) as e:
        _fail(e)
    except (RuntimeError, PoolError) as e:  # OutOfMemoryError, MambaCapacityError: SGLang fails loudly here too
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))
    labels = [f"{r.run['model']} tp{r.plan.tp_size}" for _, r in results]
    if out is not None:
        from reports.html import render_comparison, render_report

        dirs = [out] if len(results) == 1 else [out / "primary", out / "compare"]
        for d, (_, r) in zip(dirs, results):
            write_run(d, r.steps, r.requests, r.summary, r.run, extra=lambda tmp: render_report(tmp))
        if len(dirs) > 1:
            render_comparison(dirs, out)
    if as_json:
        payload = results[0][1].summary if len(results) == 1 else {lab: r.summary for lab, (_, r) in zip(labels, results)}
        typer.echo(json.dumps(payload, indent=2, default=float))
        return
    _print_summaries(labels, [r.summary for _, r in results])
    if info["skipped_lines"]:
        typer.echo(f"skipped {info['skipped_lines']} malformed trace lines")
    if out is not None:
        typer.echo(f"wrote {out}/report.html" if len(results) == 1 else f"wrote {out}/ (primary, compare, comparison)")


@app.command()
@with_server_options
def sweep(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file; default: the bundled trace."),
    grid: list[str] = typer.Option([], "--grid", help="A flag and its values, e.g. tp=1,2,4 or gpu=H100,H200 or "
                                                      "mem_fraction_static=0.8,0.9 (repeat for more axes)."),
    gpu_cost: str = typer.Option("", "--gpu-cost", help="$/GPU-hour per GPU, e.g. H100=2.5,H200=3.5: adds cost."),
    slo_p99_s: Optional[float] = typer.Option(None, "--slo-p99-s", help="p99 latency target (s)."),
    slo_on: str = typer.Option("e2e", "--slo-on", help="Which latency the SLO bounds: e2e or ttft."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Parallel simulations (default: CPU count)."),
    ray: bool = typer.Option(False, "--ray", help="Run the configurations as tasks on Ray (pip install "
                                                  "'poolsim[ray]'): the cluster in RAY_ADDRESS, else a local one."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="The Ray cluster to join (auto, "
                                              "HOST:PORT, ray://HOST:PORT); implies --ray."),
    max_new_tokens: str = typer.Option("trace", "--max-new-tokens-policy"),
    out: Optional[Path] = typer.Option(None, "--out", help="Write sweep.csv and frontier.png here."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Simulate a grid of configurations in parallel: throughput vs p99 latency, cost, the cheapest that fits."""
    from sim.sweep import cheapest_meeting, meets_slo, parse_grid, run_sweep
    from traces import DEFAULT_TRACE

    try:
        if slo_on not in ("e2e", "ttft"):
            raise ValueError(f"--slo-on {slo_on!r}: expected e2e or ttft")
        axes = parse_grid(grid)
        costs = {}
        for item in filter(None, (x.strip() for x in gpu_cost.split(","))):
            name, _, price = item.partition("=")
            costs[name.strip()] = float(price)
        first = {k: v[0] for k, v in axes.items() if k in ("model", "gpu")}
        _server({**server, **first})  # the base flags' one-line errors, before forking
        base = dict(server)
        base["tp_size"], base["dp_size"] = base.pop("tp"), base.pop("dp")
        for key in ("gpu_memory_gib", "gpu_bandwidth_tbs", "gpu_bf16_tflops", "gpu_fp8_tflops", "gpu_arch",
                    "runtime_overhead_gib"):
            base.pop(key)
        if base.get("gpu") is None and "gpu" not in axes:
            raise ValueError("--gpu (or --grid gpu=...) is required")
        path = str(trace or DEFAULT_TRACE)
        callback, bar = _progress(0, as_json, unit="configurations")
        if bar is not None:
            bar.update(bar.task_ids[0], total=1)
            bar.start()
            callback = (lambda done, total, cb=callback: (bar.update(bar.task_ids[0], total=total), cb(done, 0.0)))
        try:
            table = run_sweep(path, base, axes, costs, workers, {"max_new_tokens": max_new_tokens}, callback,
                              ray=ray_address or ray)
        finally:
            if bar is not None:
                bar.stop()
    except (ValueError, OSError) as e:
        _fail(e)
    best = (cheapest_meeting(table, slo_p99_s, slo_on) if slo_p99_s is not None and "p99_latency_s" in table
            else None)
    if slo_p99_s is not None and "p99_latency_s" in table:
        table.insert(table.columns.get_loc("error"), "meets_slo", meets_slo(table, slo_p99_s, slo_on))
    if out is not None:
        from reports.plots import plot_frontier

        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "sweep.csv", index=False)
        ok = table[table["error"] == ""] if "error" in table else table
        if len(ok):  # the x axis is the latency the SLO bounds
            shown = ok.assign(p99_latency_s=ok["p99_ttft_s"]) if slo_on == "ttft" else ok
            plot_frontier(shown, slo_s=slo_p99_s).savefig(out / "frontier.png", dpi=120)
    if as_json:
        records = table.astype(object).where(table.notna(), None).to_dict("records")  # NaN/NA -> null
        typer.echo(json.dumps({"configs": records,
                               "cheapest_meeting_slo": None if best is None else best["label"]},
                              indent=2, default=float))
        return
    cols = [c for c in ("label", "gpus", "throughput_tok_s", "p99_ttft_s", "p99_latency_s", "retractions",
                        "aborted", "binding_pool", "cost", "meets_slo", "error") if c in table.columns]
    shown = table[cols].astype(object).apply(lambda col: col.map(_cell))  # counts as integers, floats .2f, gaps -
    typer.echo(shown.to_string(index=False))
    if slo_p99_s is not None:
        typer.echo(f"\ncheapest meeting p99 {slo_on} <= {slo_p99_s:g} s: "
                   + ("none" if best is None else best["label"]))
    if out is not None:
        typer.echo(f"wrote {out}/sweep.csv" + (f" and {out}/frontier.png" if (out / "frontier.png").exists() else ""))


def _cell(value) -> str:
    """A sweep table cell: counts as integers, other numbers to 2 decimals, a refused configuration's gaps as -."""
    import numbers

    import pandas as pd

    if isinstance(value, bool):
        return "yes" if value else "no"
    if pd.isna(value):
        return "-"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:,.2f}" if isinstance(value, numbers.Real) and not isinstance(value, bool) else str(value)


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

trace_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Request traces: inspect, convert, generate, slice and scale.")
app.add_typer(trace_app, name="trace")

FORMAT_OPT = typer.Option(None, "--format", help="mooncake, azure, sharegpt, tokens or poolsim (default: detect)")
SKIP_OPT = typer.Option(False, "--skip-bad-lines", help="skip malformed lines and report how many")
JSON_OPT = typer.Option(False, "--json", help="machine-readable output")


@contextmanager
def _one_line_errors():
    """A bad trace or argument prints one line and exits 1, without a traceback."""
    from traces import TraceFormatError

    try:
        yield
    except (TraceFormatError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def _load(path: Path, fmt: str | None, skip: bool):
    from traces import load_trace

    return load_trace(path, format=fmt, skip_bad_lines=skip)


def _wrote(trace, out: Path, as_json: bool) -> None:
    from traces import write_trace

    if trace.source_path is not None and out.resolve() == trace.source_path.resolve():
        raise ValueError(f"{out} is the input trace; write to another file")
    n = write_trace(trace, out)
    info = {"path": str(out), "requests": n, "skipped_lines": trace.skipped_lines}
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(f"wrote {n} requests to {out} ({trace.skipped_lines} bad lines skipped)")


@trace_app.command("inspect")
def trace_inspect(file: Path, fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT,
                  block_size: int = typer.Option(512, help="tokens per block for the block-granularity ratio"),
                  as_json: bool = JSON_OPT) -> None:
    """Requests, duration, rate, length percentiles and prefix sharing with an unbounded cache."""
    from traces import inspect_trace

    with _one_line_errors():
        stats = inspect_trace(_load(file, fmt, skip_bad_lines), block_size=block_size)
    if as_json:
        typer.echo(json.dumps(stats.to_dict()))
    else:
        _print_stats(stats)


def _print_stats(s) -> None:
    from rich.console import Console
    from rich.table import Table

    def pct(x):
        return "-" if x is None else f"{100 * x:.2f} %"

    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_row("trace", f"{s.name} ({s.format})")
    skipped = f" ({s.skipped_lines} bad lines skipped)" if s.skipped_lines else ""
    summary.add_row("requests", f"{s.requests:,}{skipped}")
    summary.add_row("sessions", f"{s.sessions:,}" if s.sessions else "-")
    summary.add_row("duration", f"{s.duration_s:,.1f} s")
    summary.add_row("rate", "-" if s.rate_per_s is None else f"{s.rate_per_s:.3f} req/s")
    summary.add_row("prompt tokens", f"{s.prompt_tokens:,}")
    summary.add_row("prefix sharing (tokens)", f"{pct(s.token_sharing)} ({s.shared_tokens:,} tokens)")
    summary.add_row(f"prefix sharing (blocks of {s.block_size})", f"{pct(s.block_sharing)} "
                                                                    f"({s.shared_blocks:,} of {s.blocks:,} blocks)")
    lengths = Table("tokens", "mean", "p50", "p90", "p99", "max", box=None, pad_edge=False)
    for label, d in (("input", s.input_len), ("output", s.output_len)):
        if d:
            lengths.add_row(label, *(f"{d[k]:,.0f}" for k in ("mean", "p50", "p90", "p99", "max")))
    console = Console()
    console.print(summary)
    console.print(lengths)


@trace_app.command("convert")
def trace_convert(file: Path, out: Path, fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT,
                  as_json: bool = JSON_OPT) -> None:
    """Write any trace in poolsim's own JSONL format."""
    with _one_line_errors():
        _wrote(_load(file, fmt, skip_bad_lines), out, as_json)


@trace_app.command("slice")
def trace_slice(file: Path, out: Path, start: float = typer.Option(0.0, help="window start (s)"),
                end: float = typer.Option(math.inf, help="window end (s, exclusive)"),
                rebase: bool = typer.Option(True, help="shift arrivals so the window starts at 0"),
                fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT, as_json: bool = JSON_OPT) -> None:
    """Keep the requests arriving in [start, end)."""
    from traces import slice_trace

    with _one_line_errors():
        _wrote(slice_trace(_load(file, fmt, skip_bad_lines), start, end, rebase), out, as_json)


@trace_app.command("scale")
def trace_scale(file: Path, out: Path, factor: Optional[float] = typer.Option(None, help="rate multiplier"),
                rate: Optional[float] = typer.Option(None, help="target mean rate (req/s) instead of a factor"),
                fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT, as_json: bool = JSON_OPT) -> None:
    """Speed a trace up or slow it down (arrival times divided by the factor)."""
    from traces import mean_rate, scale_trace

    with _one_line_errors():
        if (factor is None) == (rate is None):
            raise ValueError("give exactly one of --factor and --rate")
        trace = _load(file, fmt, skip_bad_lines)
        _wrote(scale_trace(trace, factor if factor is not None else rate / mean_rate(trace)), out, as_json)


@trace_app.command("generate")
def trace_generate(
    out: Path,
    preset: str = typer.Option("chat", help="chat or agent: the defaults every other flag overrides"),
    seed: int = typer.Option(0),
    sessions: Optional[int] = typer.Option(None, help="number of sessions"),
    rate: Optional[str] = typer.Option(None, help="session starts: N per s, step:T=R,... or diurnal:MEAN,AMP[,PERIOD]"),
    cv: Optional[float] = typer.Option(None, help="burstiness of session starts (1 = Poisson, >1 = gamma, burstier)"),
    turns: Optional[str] = typer.Option(None, help="requests per session (a length spec, e.g. uniform:1,6)"),
    think_time: Optional[float] = typer.Option(None, help="mean seconds between a session's turns"),
    system_prompt_len: Optional[int] = typer.Option(None, help="tokens of the shared system prompt / context"),
    system_prompt_fanout: Optional[int] = typer.Option(None, help="sessions sharing each system prompt"),
    input_len: Optional[str] = typer.Option(None, help="new user tokens per turn: fixed:N, uniform:LO,HI, "
                                                        "lognormal:MEDIAN,SIGMA[,LO,HI], empirical:input,TRACE"),
    output_len: Optional[str] = typer.Option(None, help="output tokens per turn (same specs)"),
    max_new_tokens: Optional[int] = typer.Option(None, help="the client's limit; outputs are clipped to it"),
    ignore_eos: bool = typer.Option(False, help="every output runs to --max-new-tokens"),
    max_prompt_len: Optional[int] = typer.Option(None, help="a session ends before a longer prompt"),
    as_json: bool = JSON_OPT,
) -> None:
    """Generate a seeded synthetic workload (multi-turn chats or agent loops) in poolsim's format."""
    from traces import agent_spec, chat_spec, generate, parse_length, parse_rate

    with _one_line_errors():
        presets = {"chat": chat_spec, "agent": agent_spec}
        if preset not in presets:
            raise ValueError(f"unknown preset {preset!r}: chat or agent")
        given = dict(num_sessions=sessions, cv=cv, think_time_s=think_time, system_prompt_len=system_prompt_len,
                     system_prompt_fanout=system_prompt_fanout, max_new_tokens=max_new_tokens,
                     max_prompt_len=max_prompt_len, ignore_eos=ignore_eos or None,
                     rate=None if rate is None else parse_rate(rate),
                     turns=None if turns is None else parse_length(turns),
                     input_len=None if input_len is None else parse_length(input_len),
                     output_len=None if output_len is None else parse_length(output_len))
        spec = presets[preset](**{k: v for k, v in given.items() if v is not None})
        _wrote(generate(spec, seed=seed, name=out.stem), out, as_json)

@app.command()
def report(
    run_dir: str = typer.Argument(..., metavar="DIR", help="A run folder written by `poolsim run --out DIR`."),
    compare: list[str] = typer.Option([], "--compare", metavar="OTHER_DIR",
                                      help="Another run folder to compare with (repeatable)."),
    out: str | None = typer.Option(None, "--out", metavar="DIR", help="Where to write the page (default: DIR)."),
) -> None:
    """Re-render a run's HTML report (and PNGs) from its saved data; with --compare, a side-by-side page."""
    from reports.html import ReportError, render_comparison, render_report

    try:
        page = (render_comparison([run_dir, *compare], out or run_dir) if compare
                else render_report(run_dir, out))
    except ReportError as e:
        _fail(e)
    typer.echo(str(page))


if __name__ == "__main__":
    app()
