"""poolsim command line: a thin typer layer over the library (trace -> sim -> pools -> metrics -> report)."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import sys
import time
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

# poolsim calls no BLAS routine, yet OpenBLAS starts a worker thread per core when numpy loads and they spin
# for ~0.1 CPU s: one thread unless the user set it (before anything imports numpy)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer  # noqa: E402

from poolsim.sim import ROUTERS  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Capacity planner for LLM-serving memory: SGLang's pools, radix cache and scheduler, simulated.")


@app.command()
def version() -> None:
    """Print the poolsim version and which simulator core runs (compiled by pip install -e ., or pure Python)."""
    from importlib.metadata import version as _v

    import poolsim.sim.scheduler  # noqa: F401  (a compiled module when the build exists)
    from poolsim.compiled import core_description

    typer.echo(f"{_v('poolsim')}, simulator core {core_description()}")


def _print_version(value: bool) -> None:
    if value:
        version()
        raise typer.Exit()


@app.callback()
def _main(show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                            help="Print the poolsim version and exit.")) -> None:
    pass


def _fail(error: Exception) -> None:
    """Bad input: one line on stderr, exit code 2, nothing written."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(2)


def _sglang_options() -> dict:
    """An option per ServerArgs field, from pools.sizing.server_args.SERVER_FLAGS: the field's type and default."""
    from poolsim.pools.sizing.server_args import SERVER_FLAGS, ServerArgs

    types, defaults = typing.get_type_hints(ServerArgs), ServerArgs()
    return {f.field: (types[f.field], typer.Option(getattr(defaults, f.field), *f.names, help=f.help))
            for f in SERVER_FLAGS}


def _hidden_sglang_options() -> dict:
    """SERVER_FLAGS' hidden names (SGLang's names too long for --help's name column): a hidden option each,
    ``option key -> (type, typer.Option, the field it sets)``."""
    from poolsim.pools.sizing.server_args import SERVER_FLAGS, ServerArgs

    types = typing.get_type_hints(ServerArgs)
    return {f"{f.field}__as_{i}": (Optional[types[f.field]],
                                   typer.Option(None, name, hidden=True, help=f"{f.names[0]}, by SGLang's name."),
                                   f.field)
            for f in SERVER_FLAGS for i, name in enumerate(f.hidden_names)}


# The server flags shared by every command that builds a server: name -> (type, typer.Option). SGLang's come from
# ServerArgs; poolsim's own (which model and GPU, a custom GPU, the memory taken before SGLang starts) are here.
SERVER_OPTIONS = {
    "model": (str, typer.Option(..., "--model", "--model-path",
                                help="Catalog name (see `poolsim models`) or a config.json path.")),
    "gpu": (Optional[str], typer.Option(None, "--gpu", help="Catalog name (see `poolsim gpus`).")),
    **_sglang_options(),
    "runtime_overhead_gib": (Optional[float], typer.Option(
        None, "--runtime-overhead-gib", help="GPU memory taken before weights load (default 1.22 GiB at tp 1, "
        "3.11 GiB above; from SGLang logs).")),
    "gpu_memory_gib": (Optional[float], typer.Option(None, "--gpu-memory-gib", help="Custom GPU: memory (GiB).")),
    "gpu_bandwidth_tbs": (Optional[float], typer.Option(None, "--gpu-bandwidth-tbs", help="Custom GPU: HBM TB/s.")),
    "gpu_bf16_tflops": (Optional[float], typer.Option(None, "--gpu-bf16-tflops", help="Custom GPU: dense bf16.")),
    "gpu_fp8_tflops": (Optional[float], typer.Option(None, "--gpu-fp8-tflops", help="Custom GPU: dense fp8.")),
    "gpu_arch": (Optional[str], typer.Option(None, "--gpu-arch", help="Custom GPU: sm80, sm89, sm90, sm100 or "
                                                                      "gfx942.")),
}


HIDDEN_SERVER_OPTIONS = _hidden_sglang_options()


def with_server_options(command):
    """Give a command every SGLang server flag; it receives them as one dict, ``server``."""
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "server"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind)
             for name, (kind, opt) in SERVER_OPTIONS.items()]
    extra += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind)
              for name, (kind, opt, _) in HIDDEN_SERVER_OPTIONS.items()]
    hints = typing.get_type_hints(command)

    @functools.wraps(command)
    def wrapper(**kwargs):
        server = {name: kwargs.pop(name) for name in SERVER_OPTIONS}
        for name, (_, _, field) in HIDDEN_SERVER_OPTIONS.items():  # a hidden name sets its field
            value = kwargs.pop(name)
            if value is not None:
                server[field] = value
        return command(server=server, **kwargs)

    wrapper.__signature__ = inspect.Signature(
        [p.replace(annotation=hints.get(p.name, p.annotation)) for p in own] + extra)
    wrapper.__annotations__ = {**{p.name: hints.get(p.name) for p in own}, **{n: k for n, (k, _) in SERVER_OPTIONS.items()},
                               **{n: k for n, (k, _, _) in HIDDEN_SERVER_OPTIONS.items()}}
    del wrapper.__wrapped__  # typer must see the new signature, not the original's
    return wrapper


def stoppable(what: str = "", keeps_files: bool = False):
    """SIGTERM/SIGHUP/Ctrl-C end the command with the cleanup Ctrl-C gets and one line saying what was kept
    (app/signals.py). ``keeps_files``: the command writes its ``--out`` files one by one (calibrate), so those
    already written stay."""
    def decorate(command):
        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            from poolsim.app.signals import stopping

            out = kwargs.get("out")
            if keeps_files and out is not None:
                with stopping(None, f"{what}; the files already written to {out} are kept"):
                    return command(*args, **kwargs)
            with stopping(out, what):
                return command(*args, **kwargs)
        return wrapper
    return decorate


def _log_warnings(warnings) -> None:
    """What SGLang logs as warnings for this configuration (e.g. the clamp of --max-total-tokens), on stderr."""
    for w in warnings:
        typer.echo(f"WARNING {w}", err=True)


@app.command()
@with_server_options
def plan(
    server: dict,
    concurrency_at: str = typer.Option("1024,8192,32768,131072", "--concurrency-at",
                                       help="Comma-separated context lengths for the concurrency table."),
    compare: bool = typer.Option(False, "--compare", help="Hybrid vs the same model with every layer full attention."),
    against: Optional[str] = typer.Option(None, "--against", help="A second model for --compare."),
    against_tp: Optional[int] = typer.Option(None, "--against-tp", help="tp for --against (default: --tp)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the --compare plot (PNG) here."),
    force: bool = typer.Option(False, "--force", help="Overwrite a --plot file poolsim did not write."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """How many KV tokens, request rows and state slots SGLang 0.5.23 allocates, and what fits."""
    from poolsim.app.output import PNG_SOFTWARE, check_out_file, png_by_poolsim, write_file
    from poolsim.app.plan import PLAN_COMPARE_CONTEXT_LENS, compare_plans
    from poolsim.app.server import load_server
    from poolsim.pools.sizing.plan import compare_table, max_concurrency, plan_memory

    try:
        if plot is not None:
            check_out_file(plot, force, png_by_poolsim)
        lengths = [int(x) for x in concurrency_at.split(",") if x.strip()]
        spec, card, args, runtime_overhead_gib = load_server(server)
        tp = args.tp_size
        result = plan_memory(spec, card, args, runtime_overhead_gib=runtime_overhead_gib)
        concurrency = max_concurrency(result, lengths)
        comparison = None
        if compare or against or plot:
            comparison = compare_plans(spec, card, args, result, PLAN_COMPARE_CONTEXT_LENS,
                                       runtime_overhead_gib=runtime_overhead_gib, against=against,
                                       against_tp=against_tp)
    except ValueError as e:
        _fail(e)
    _log_warnings(result.warnings)
    if plot is not None:
        from poolsim.reports.plan_plots import plot_plan_compare

        fig = plot_plan_compare(comparison["records"], comparison.get("crossover_context_len"),
                                title=f"{spec.name} on {card.name}, tp {tp}")
        try:
            write_file(plot, lambda tmp: fig.savefig(tmp, format="png", dpi=120,
                                                     metadata={"Software": PNG_SOFTWARE}), force, png_by_poolsim)
        except (ValueError, OSError) as e:
            _fail(e)
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
    from poolsim.traces import DEFAULT_TRACE, load_trace

    return load_trace(path or DEFAULT_TRACE, format=fmt, skip_bad_lines=skip_bad_lines)


def _bar(label: str, unit: str, sim_time: bool = True, console=None):
    """A transient rich bar on stderr, narrow enough for an 80-column terminal with a long model name."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn(label), BarColumn(bar_width=10), MofNCompleteColumn(), TextColumn(unit)]
    if sim_time:
        columns.append(TextColumn("sim {task.fields[t]:,.0f} s"))
    columns += [TextColumn("ETA"), TimeRemainingColumn()]
    return Progress(*columns, console=console or Console(stderr=True), transient=True)


def _progress(total: int, quiet: bool):
    """The sweep's bar over finished configurations; the callback and the context to close it."""
    if quiet:
        return None, None
    bar = _bar("sweep", "configurations", sim_time=False)
    task = bar.add_task("run", total=total, t=0.0)
    return (lambda done, t: bar.update(task, completed=done, t=t)), bar


class RunProgress:
    """Finished requests with an ETA on stderr: a live bar on a terminal; otherwise (redirected) one plain line
    every EVERY_S seconds, so a log shows the run is alive without filling up."""

    EVERY_S = 10.0  # wall seconds between plain lines

    def __init__(self, total: int, label: str, show: bool = True, first=None):
        self.total, self.label, self.first = total, label, first  # first(): once, when the first step is done
        self.started = self.last = time.monotonic()
        self.bar = self.task = None
        self.show = show
        if show and sys.stderr.isatty():
            self.bar = _bar(label, "requests")
            self.task = self.bar.add_task("run", total=total, t=0.0)

    def __call__(self, done: int, t: float) -> None:
        if self.first is not None:
            self.first()
            self.first = None
        if not self.show:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=done, t=t)
            return
        now = time.monotonic()
        if now - self.last < self.EVERY_S:
            return
        self.last = now
        elapsed = now - self.started
        eta = f"{elapsed * (self.total - done) / done:,.0f} s" if done else "-"
        typer.echo(f"simulating {self.label}: {done:,}/{self.total:,} requests ({done / max(self.total, 1):.0%}), "
                   f"sim t={t:,.1f} s, elapsed {elapsed:,.0f} s, ETA {eta}", err=True)

    def __enter__(self) -> "RunProgress":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _describe(model, gpu, args, plan, trace_info: dict) -> str:
    """What a run simulates, printed before it starts."""
    kv = (f"full KV pool {plan.max_total_num_tokens:,} + SWA KV pool {plan.swa_max_total_num_tokens:,} tokens"
          if plan.is_hybrid_swa else f"KV pool {plan.max_total_num_tokens:,} tokens")
    pools = (f"{kv} (page {plan.page_size}), {plan.max_running_requests:,} request rows"
             + (f", {plan.max_mamba_cache_size:,} mamba slots" if plan.max_mamba_cache_size else ""))
    gpus = args.tp_size * args.dp_size
    return (f"simulating {model.name} on {gpus} x {gpu.name} (tp {args.tp_size}, dp {args.dp_size}); trace "
            f"{trace_info.get('name')} ({trace_info.get('format')}, {trace_info.get('requests', 0):,} requests); "
            f"per replica: {pools}")


def _simulate(trace, server: tuple, opts: dict, trace_info: dict, quiet: bool, announce: bool = False):
    """``server``: load_server's (model, GPU, ServerArgs, runtime overhead)."""
    from poolsim.app.run import check_run_options, simulate
    from poolsim.pools.sizing.plan import plan_memory

    model, gpu, args, overhead = server
    check_run_options(opts["router"], None, opts["slo_on"], opts["slo_p99_s"])  # as simulate: before planning
    plan = plan_memory(model, gpu, args, runtime_overhead_gib=overhead)

    def describe():  # once the server is built and stepping: every flag has passed SGLang's checks
        _log_warnings(plan.warnings)
        for note in plan.notes:  # what poolsim assumed reading the model, as `plan` shows it
            typer.echo(f"note: {note}", err=True)
        typer.echo(_describe(model, gpu, args, plan, trace_info))

    with RunProgress(trace_info.get("requests") or 0, f"{model.name} tp{args.tp_size}", show=not quiet,
                     first=describe if announce else None) as progress:
        return simulate(trace, model, gpu, args, trace_info=trace_info, runtime_overhead_gib=overhead,
                        progress=progress, plan=plan, **opts)


def _speculative_row(s: dict) -> str:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    return (f"{s['speculative_algorithm']}: accept length {num(s['speculative_accept_length'], '.2f')} "
            f"({s['speculative_accept_length_source']}), {num(s['speculative_tokens_per_step'], ',.1f')} tokens per "
            f"decode step, draft {num(s['speculative_draft_overhead'], '.0%')} of decode time")


def _suggest(result, trace, server: tuple, opts: dict, quiet: bool) -> None:
    """DOES NOT FIT: the smallest change that fits (app/suggest.py), recorded in run.json as ``would_fit`` (the
    flags, and the command line with them) for the console and the report."""
    from poolsim.app.suggest import what_would_fit

    if result.summary["verdict_status"] != "does_not_fit":
        return
    model, gpu, args, overhead = server
    if not quiet:
        typer.echo("it does not fit: simulating a few larger servers to say what would ...", err=True)
    found = what_would_fit(trace, model, gpu, args, runtime_overhead_gib=overhead,
                           **{k: v for k, v in opts.items() if k in ("seed", "max_new_tokens", "router", "step_time",
                                                                      "calibration", "slo_p99_s", "slo_on")})
    result.run["would_fit"] = None if found is None else {**found.to_dict(), "command": _command_with(found.flags)}
    if found is None:
        from poolsim.app.suggest import candidates

        result.run["would_fit_tried"] = [" ".join(f"{k} {v}" for k, v in f.items()) for f, _, _ in
                                         candidates(gpu, args)]


def _command_with(flags: dict) -> str:
    """This command line with ``flags`` set (an alias the user typed is replaced in place, else appended)."""
    import shlex

    aliases = {"--dp": ("--dp", "--dp-size"), "--tp": ("--tp", "--tp-size"), "--gpu": ("--gpu",)}
    argv = ["poolsim", *sys.argv[1:]]
    for flag, value in flags.items():
        names = aliases.get(flag, (flag,))
        for i, arg in enumerate(argv):
            if arg in names and i + 1 < len(argv):
                argv[i + 1] = str(value)
                break
            if arg.split("=", 1)[0] in names and "=" in arg:
                argv[i] = f"{arg.split('=', 1)[0]}={value}"
                break
        else:
            argv += [flag, str(value)]
    return shlex.join(argv)


def _summary_rows(summary: dict) -> list[tuple[str, str]]:
    from poolsim.reports import units

    def ms(x):  # as the report prints it (three significant digits), so the two agree
        return "-" if x is None else units.seconds(x)

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
        ("prefix-cache hit rate", f"{units.percent(summary['cache_hit_rate'])} of prefill tokens"),
    ]
    if "verdict_status" in summary:  # the numbers the verdict is decided on (reports/METRICS.md, "The verdict")
        share, rate = summary["queue_wait_share_p50"], summary["arrival_rate_req_s"]
        rows += [
            ("verdict", summary["verdict_status"].replace("_", " ")
             + (f" ({summary['verdict_failures'].replace(' ', ', ')})" if summary["verdict_failures"] else "")),
            ("admission wait p50 (share of latency)",
             f"{ms(summary['queue_wait_s']['p50'])} ({'-' if share is None else units.percent(share)})"),
            ("unfinished at the last arrival", f"{summary['backlog_at_last_arrival']:,} of {summary['requests']:,} "
                                               f"({units.percent(summary['backlog_frac_at_last_arrival'])})"),
            ("arriving / served",
             f"{'-' if rate is None else f'{rate:,.2f}'} / {summary['throughput_req_s']:,.2f} req/s"),
        ]
        if summary["aborted"]:
            rows.append(("aborted by cause", ", ".join(f"{k.replace('_', ' ')} {v:,}"
                                                       for k, v in summary["abort_causes"].items() if v)))
        if summary.get("slo_p99_s") is not None:
            rows.append((f"SLO p99 {summary['slo_on']}", f"{ms(summary['slo_observed_p99_s'])} "
                                                         f"(target {ms(summary['slo_p99_s'])})"))
    if summary.get("speculative_algorithm"):  # the run's speculative decoding (reports/METRICS.md)
        rows.append(("speculative decoding", _speculative_row(summary)))
    kv_label = "full KV tokens" if "swa" in pools else "KV tokens"
    for name, label in (("kv", kv_label), ("swa", "SWA KV tokens"), ("rows", "request rows"), ("mamba", "mamba slots")):
        if name in pools:
            p = pools[name]
            # the capacity is in the value: compared servers have their own
            # as the report prints percentages: 0.4 % is "0.4%", never a rounded "0%"
            rows.append((label, f"capacity {p['capacity']:,}: peak {units.percent(p['peak_used_frac'])}, "
                                f"mean {units.percent(p['mean_used_frac'])}"
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
    rows = [dict(_summary_rows(s)) for s in summaries]
    names = list(dict.fromkeys(name for r in rows for name in r))  # by name: a row one server lacks shows "-"
    for name in names:
        table.add_row(name, *(r.get(name, "-") for r in rows))
    console = Console()
    console.print(table)
    for label, s in zip(labels, summaries):
        console.print(f"[bold]{label}:[/bold] {s['verdict']}" if len(labels) > 1 else s["verdict"])


@app.command()
@with_server_options
@stoppable()
def run(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file (any supported format); default: the bundled trace."),
    fmt: Optional[str] = typer.Option(None, "--format",
                                      help="mooncake, azure, sharegpt, tokens or poolsim (default: detect)."),
    skip_bad_lines: bool = typer.Option(False, "--skip-bad-lines", help="Skip malformed trace lines, report how many."),
    seed: int = typer.Option(0, "--seed", help="Recorded with the run; the simulation itself is deterministic."),
    max_new_tokens: str = typer.Option("trace", "--max-new-tokens-policy",
                                       help="trace (max_new_tokens = the trace's, else its output length), "
                                            "ignore_eos, or fixed:N (clients ask N; generation stops at the "
                                            "trace's output length)."),
    router: str = typer.Option("round_robin", "--router", help=f"dp router: {' or '.join(ROUTERS)}."),
    step_time: str = typer.Option("analytic", "--step-time", help="analytic, or fixed:MILLISECONDS."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Step-time coefficients (JSON)."),
    compare_model: Optional[str] = typer.Option(None, "--compare-model",
                                                help="Run the same trace through a second model, side by side."),
    compare_tp: Optional[int] = typer.Option(None, "--compare-tp", help="tp for --compare-model (default: --tp)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write frames, summary and the HTML report here."),
    check: bool = typer.Option(False, "--check", help="Debug: check every pool's invariants at every step."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (or both) as one JSON object."),
    slo_p99_s: Optional[float] = typer.Option(None, "--slo-p99-s", help="p99 latency target (s); the verdict checks it."),
    slo_on: str = typer.Option("e2e", "--slo-on", help="Which latency the SLO bounds: e2e or ttft."),
    table_format: str = typer.Option("csv", "--table-format",
                                     help="Step and request tables under --out: csv, or parquet (needs pyarrow: "
                                          "the parquet extra)."),
    suggest: bool = typer.Option(True, "--suggest/--no-suggest",
                                 help="When it does not fit: simulate a few larger servers (dp x2, tp x2, the next "
                                      "larger GPU, dp x4) and name the first that fits."),
) -> None:
    """Replay a trace through SGLang's scheduler and pools: retractions, aborts, cache hits, latency."""
    from contextlib import nullcontext

    from poolsim.app.output import check_out_dir, publish_dir, run_dirs, write_runs
    from poolsim.app.run import check_router, check_step_time
    from poolsim.app.server import load_server, second_model_args
    from poolsim.pools.errors import PoolError
    from poolsim.pools.model.config import ModelConfig
    from poolsim.sim.metrics import check_table_format

    opts = dict(seed=seed, max_new_tokens=max_new_tokens, router=router, step_time=step_time,
                calibration=str(calibration) if calibration else None, check=check, slo_p99_s=slo_p99_s,
                slo_on=slo_on, table_format=table_format, keep_steps=False)  # the step table goes to disk only
    try:
        check_router(router)
        check_step_time(step_time, calibration)
        check_table_format(table_format)
        out_state = None if out is None else check_out_dir(out)  # before the (long) simulation
        second = None if compare_model is None else ModelConfig.load(compare_model, "--compare-model")
        loaded = _load_trace(trace, fmt, skip_bad_lines)
        info = {"path": str(loaded.source_path or trace or ""), "name": loaded.name, "format": loaded.format,
                "requests": len(loaded), "skipped_lines": loaded.skipped_lines}
        # With --out, simulate inside the folder being published: the step table streams into it chunk by
        # chunk (sim.metrics.Table), and a failed or interrupted run leaves nothing behind.
        with publish_dir(out) if out is not None else nullcontext() as tmp:
            dirs = run_dirs(tmp, bool(compare_model))
            primary = load_server(server)
            results = [("primary", _simulate(loaded, primary, dict(opts, stream_dir=dirs[0]), info,
                                             quiet or as_json, not as_json))]
            if compare_model:
                _, gpu, args, overhead = primary
                other = (second, gpu, second_model_args(args, compare_tp), overhead)
                results.append(("compare", _simulate(loaded, other, dict(opts, stream_dir=dirs[1]), info,
                                                     quiet or as_json, not as_json)))
            if suggest and not compare_model:
                _suggest(results[0][1], loaded, primary, opts, quiet or as_json)
            if tmp is not None:
                write_runs(tmp, dirs, [r for _, r in results], table_format)
    except (ValueError, OSError) as e:  # also: another run took the folder meanwhile
        _fail(e)
    except (RuntimeError, PoolError) as e:  # OutOfMemoryError, MambaCapacityError: SGLang fails loudly here too
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))
    labels = [f"{r.run['model']} tp{r.plan.tp_size}" for _, r in results]
    if as_json:
        payload = results[0][1].summary if len(results) == 1 else {lab: r.summary for lab, (_, r) in zip(labels, results)}
        typer.echo(json.dumps(payload, indent=2, default=float))
        return
    _print_summaries(labels, [r.summary for _, r in results])
    fit = results[0][1].run.get("would_fit")
    if fit is not None:
        typer.echo(f"would fit: {fit['command']}  ({fit['gpus']} GPUs: {fit['verdict_status'].replace('_', ' ')})")
    elif "would_fit" in results[0][1].run:
        typer.echo(f"would fit: none of {', '.join(results[0][1].run['would_fit_tried'])} (try `poolsim sweep`)")
    typer.echo(f"time model: {results[0][1].run['step_time_model']}")
    if calibration is not None:
        from poolsim.kernels.calibrate import describe

        typer.echo(describe(calibration))
    if info["skipped_lines"]:
        typer.echo(f"skipped {info['skipped_lines']} malformed trace lines")
    if out is not None:
        replaced = " (replaced the previous run there)" if out_state == "previous run" else ""
        typer.echo((f"wrote {out}/report.html" if len(results) == 1 else
                    f"wrote {out}/comparison.html, {out}/primary/ and {out}/compare/") + replaced)


@app.command()
@with_server_options
@stoppable("; the sweep's workers were terminated")
def sweep(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file; default: the bundled trace."),
    grid: list[str] = typer.Option([], "--grid", metavar="AXIS", help="A flag and its values, e.g. tp=1,2,4 or "
                                   "gpu=H100,H200 or page_size=1,16 (repeat for more axes)."),
    gpu_cost: str = typer.Option("", "--gpu-cost", help="$/GPU-hour per GPU, e.g. H100=2.5,H200=3.5: adds cost."),
    slo_p99_s: Optional[float] = typer.Option(None, "--slo-p99-s", help="p99 latency target (s)."),
    slo_on: str = typer.Option("e2e", "--slo-on", help="Which latency the SLO bounds: e2e or ttft."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Parallel simulations (default: CPU count)."),
    ray: bool = typer.Option(False, "--ray", help="Run the configurations as tasks on Ray (pip install "
                                                  "'poolsim[ray]'): the cluster in RAY_ADDRESS, else a local one."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="The Ray cluster to join (auto, "
                                              "HOST:PORT, ray://HOST:PORT); implies --ray."),
    max_new_tokens: str = typer.Option("trace", "--max-new-tokens-policy",
                                       help="trace, ignore_eos or fixed:N, as for `run`."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write sweep.csv and frontier.png here."),
    capacity: bool = typer.Option(False, "--capacity", help="Also find each configuration's capacity (the "
                                  "highest load scale meeting --slo-p99-s, as `poolsim capacity`): a column."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as one JSON object."),
) -> None:
    """Simulate a grid of configurations in parallel: throughput vs p99 latency, cost, the cheapest that fits."""
    from poolsim.app.output import check_out_dir, publish_dir
    from poolsim.app.run import check_run_options
    from poolsim.app.sweep import apply_slo, base_config, parse_gpu_cost, parse_grid, run_sweep, write_sweep
    from poolsim.traces import DEFAULT_TRACE

    try:
        if out is not None:
            check_out_dir(out)  # before the (long) sweep
        check_run_options(slo_on=slo_on, slo_p99_s=slo_p99_s)
        axes = parse_grid(grid)
        costs = parse_gpu_cost(gpu_cost)
        base = base_config(server, axes)
        path = str(trace or DEFAULT_TRACE)
        _load_trace(trace, None, False)  # a bad trace is one error for the command, not one per configuration
        callback, bar = _progress(0, as_json)
        if bar is not None:
            bar.update(bar.task_ids[0], total=1)
            bar.start()
            callback = (lambda done, total, cb=callback: (bar.update(bar.task_ids[0], total=total), cb(done, 0.0)))
        try:
            opts = {"max_new_tokens": max_new_tokens}
            if capacity:
                if slo_p99_s is None:
                    raise ValueError("--capacity needs --slo-p99-s: the capacity is the load at which it holds")
                opts["capacity_slo"] = (slo_p99_s, slo_on)
            table = run_sweep(path, base, axes, costs, workers, opts, callback,
                              ray=ray_address or ray)
        finally:
            if bar is not None:
                bar.stop()
    except (ValueError, OSError) as e:
        _fail(e)
    best = apply_slo(table, slo_p99_s, slo_on)
    if out is not None:
        try:
            with publish_dir(out) as tmp:
                write_sweep(tmp, table, slo_p99_s, slo_on)
        except (ValueError, OSError) as e:
            _fail(e)
    if as_json:
        records = table.astype(object).where(table.notna(), None).to_dict("records")  # NaN/NA -> null
        typer.echo(json.dumps({"configs": records, "cheapest_meeting_slo": best}, indent=2, default=float))
        return
    cols = [c for c in ("label", "gpus", "throughput_tok_s", "p99_ttft_s", "p99_latency_s", "retractions",
                        "aborted", "binding_pool", "cost", "meets_slo", "capacity_scale", "error")
            if c in table.columns]
    shown = table[cols].astype(object).apply(lambda col: col.map(_cell))  # counts as integers, floats .2f, gaps -
    typer.echo(shown.to_string(index=False))
    if slo_p99_s is not None:
        typer.echo(f"\ncheapest meeting p99 {slo_on} <= {slo_p99_s:g} s: {best or 'none'}")
    if out is not None:
        typer.echo(f"wrote {out}/sweep.csv" + (f" and {out}/frontier.png" if (out / "frontier.png").exists() else ""))


@app.command()
@with_server_options
@stoppable()
def capacity(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file; default: the bundled trace."),
    slo_p99_s: float = typer.Option(..., "--slo-p99-s", help="p99 latency target (s) that must hold."),
    slo_on: str = typer.Option("e2e", "--slo-on", help="Which latency the SLO bounds: e2e or ttft."),
    fmt: Optional[str] = typer.Option(None, "--format", help="Trace format (default: detect)."),
    max_new_tokens: str = typer.Option("trace", "--max-new-tokens-policy",
                                       help="trace, ignore_eos or fixed:N, as for `run`."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the p99-latency and throughput vs load "
                                        "figure (PNG) here."),
    force: bool = typer.Option(False, "--force", help="Overwrite a --plot file poolsim did not write."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """How much traffic this configuration takes: the highest arrival-rate scale of the trace (its gaps divided
    by x, prefix structure kept) at which the verdict and the p99 SLO still hold, each point simulated in full."""
    from poolsim.app.capacity import find_capacity
    from poolsim.app.output import PNG_SOFTWARE, check_out_file, png_by_poolsim, write_file
    from poolsim.app.run import check_run_options
    from poolsim.app.server import load_server
    from poolsim.pools.errors import PoolError
    from poolsim.reports import units

    def report(point) -> None:
        if not (quiet or as_json):
            typer.echo(f"  x{point.scale:.4g}: {'holds' if point.holds else 'does not hold'} "
                       f"({point.verdict_status.replace('_', ' ')}), p99 {slo_on} {units.seconds(point.p99_s)}, "
                       f"{point.throughput_req_s:,.2f} req/s", err=True)

    try:
        check_run_options(slo_p99_s=slo_p99_s, slo_on=slo_on)
        if plot is not None:
            check_out_file(plot, force, png_by_poolsim)
        loaded = _load_trace(trace, fmt, False)
        model, gpu, args, overhead = load_server(server)
        result = find_capacity(loaded, model, gpu, args, slo_p99_s, slo_on, progress=report,
                               max_new_tokens=max_new_tokens, runtime_overhead_gib=overhead)
    except (ValueError, OSError) as e:
        _fail(e)
    except (RuntimeError, PoolError) as e:
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))
    data = result.to_dict()
    if plot is not None:
        from poolsim.reports.plots import plot_capacity

        fig = plot_capacity(data["points"], slo_p99_s, slo_on, result.scale)
        try:
            write_file(plot, lambda tmp: fig.savefig(tmp, format="png", dpi=120, metadata={"Software": PNG_SOFTWARE}),
                       force, png_by_poolsim)
        except (ValueError, OSError) as e:
            _fail(e)
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=float))
        return
    lo, hi = result.bracket
    if result.scale is None:
        typer.echo(f"capacity: none: even at x{hi:.4g} of the trace's arrival rate the verdict or the SLO (p99 "
                   f"{slo_on} <= {units.seconds(slo_p99_s)}) fails")
    else:
        best = result.best
        above = f", fails at x{hi:.4g}" if hi is not None else " (the highest load tried)"
        typer.echo(f"capacity: x{lo:.4g} the trace's arrival rate{above}: {data['arrival_rate_req_s']:,.2f} req/s "
                   f"arriving, sustained {best.throughput_req_s:,.2f} req/s and {best.output_tok_s:,.0f} output "
                   f"tok/s with p99 {slo_on} {units.seconds(best.p99_s)} (SLO {units.seconds(slo_p99_s)}; "
                   f"{len(result.points)} simulations)")
    if plot is not None:
        typer.echo(f"wrote {plot}")


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
def models(as_json: bool = typer.Option(False, "--json", help="Print one JSON list.")) -> None:
    """The bundled model catalog."""
    from poolsim.pools.model.config import ModelConfig

    if as_json:
        rows = []
        for name in ModelConfig.catalog_names():
            m = ModelConfig.load(name)
            rows.append({"name": name, "architecture": m.architecture, "layers": len(m.layers),
                         "attention_layers": len(m.full_attention_layer_ids), "attention_arch": m.attention_arch,
                         "linear_layers": len(m.linear_layer_ids),
                         "linear_attn": m.linear_attn.kind if m.linear_attn else None,
                         "swa_layers": len(m.swa_layer_ids), "dsa": bool(m.dsa),
                         "params": m.param_count(), "active_params": m.active_param_count(),
                         "context_len": m.derived_context_len, "weight_dtype": m.weight_dtype})
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(f"{'name':<26} {'architecture':<34} {'layers (attn/other)':>24} {'params':>9} {'active':>8} "
               f"{'context':>9}  weights")
    for name in ModelConfig.catalog_names():
        m = ModelConfig.load(name)
        attn = len(m.full_attention_layer_ids) - len(m.swa_layer_ids)
        other = (f"{len(m.swa_layer_ids)} swa" if m.swa_layer_ids else
                 f"{len(m.linear_layer_ids)} {m.linear_attn.kind if m.linear_attn else '-'}")
        kind = "dsa" if m.dsa else m.attention_arch
        layers = f"{len(m.layers)} ({attn} {kind}/{other})"
        typer.echo(f"{name:<26} {m.architecture:<34} {layers:>24} {m.param_count() / 1e9:>8.1f}B "
                   f"{m.active_param_count() / 1e9:>7.1f}B {m.derived_context_len:>9,}  {m.weight_dtype}")


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json", help="Print one JSON list.")) -> None:
    """The bundled GPU catalog (dense FLOP/s)."""
    from poolsim.pools.hardware.gpu_catalog import GPU_CATALOG

    if as_json:
        typer.echo(json.dumps([{"key": key, "name": g.name, "memory_bytes": g.total_bytes,
                                "hbm_bytes_per_s": g.hbm_bandwidth, "bf16_flops": g.bf16_flops,
                                "fp8_flops": g.fp8_flops or None, "arch": g.arch}
                               for key, g in GPU_CATALOG.items()], indent=2))
        return
    typer.echo(f"{'name':<10} {'model':<16} {'memory':>11} {'HBM':>9} {'bf16':>11} {'fp8':>11}  arch")
    for key, g in GPU_CATALOG.items():
        fp8 = f"{g.fp8_flops / 1e12:,.0f} TF" if g.fp8_flops else "-"
        typer.echo(f"{key:<10} {g.name:<16} {g.total_bytes / 2**30:>7.1f} GiB {g.hbm_bandwidth / 1e12:>5.2f} TB/s "
                   f"{g.bf16_flops / 1e12:>8,.0f} TF {fp8:>11}  {g.arch}")

trace_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                        help="Request traces: inspect, convert, generate, slice and scale.")
app.add_typer(trace_app, name="trace")

FORMAT_OPT = typer.Option(None, "--format", help="mooncake, azure, sharegpt, tokens or poolsim (default: detect)")
SKIP_OPT = typer.Option(False, "--skip-bad-lines", help="skip malformed lines and report how many")
JSON_OPT = typer.Option(False, "--json", help="machine-readable output")
FILE_ARG = typer.Argument(..., help="trace file (any supported format)")
OUT_ARG = typer.Argument(..., help="the trace to write, in poolsim's JSONL format")
FORCE_OPT = typer.Option(False, "--force", help="overwrite OUT even if it is not a poolsim-format trace")


@contextmanager
def _one_line_errors():
    """A bad trace or argument prints one line and exits 2 (as every command does), without a traceback."""
    from poolsim.traces import TraceFormatError

    try:
        yield
    except (TraceFormatError, ValueError, OSError) as e:
        _fail(e)


def _load(path: Path, fmt: str | None, skip: bool):
    from poolsim.traces import load_trace

    return load_trace(path, format=fmt, skip_bad_lines=skip)


def _check_out(out: Path, force: bool, source: Path | None = None) -> None:
    """Before any work: OUT is not the input, not a folder, and an existing file is replaced only with --force."""
    from poolsim.app.output import check_out_file

    if source is not None and out.resolve() == source.resolve():
        raise ValueError(f"{out} is the input trace; write to another file")
    check_out_file(out, force, _poolsim_trace)


def _poolsim_trace(path: Path) -> bool:
    """An existing file poolsim may replace: a trace in poolsim's own format (what these commands write)."""
    from poolsim.traces import detect_format

    try:
        return detect_format(path) == "poolsim"
    except (ValueError, OSError):
        return False


def _wrote(trace, out: Path, as_json: bool, force: bool, empty: str = "the result holds no request") -> None:
    """Write ``trace`` to ``out`` atomically; a trace with no request is an error (``empty`` says why) and leaves
    ``out`` as it was: `run` would refuse it, and a poolsim-format file would then need --force to replace."""
    from poolsim.app.output import write_file
    from poolsim.traces import write_trace

    _check_out(out, force, trace.source_path)
    written = []

    def write(tmp):
        written.append(write_trace(trace, tmp))
        if not written[0]:
            raise ValueError(f"{empty}; nothing written to {out}")

    write_file(out, write, force, _poolsim_trace)
    n = written[0]
    info = {"path": str(out), "requests": n, "skipped_lines": trace.skipped_lines}
    if as_json:
        typer.echo(json.dumps(info))
    else:
        typer.echo(f"wrote {n} requests to {out} ({trace.skipped_lines} bad lines skipped)")


@trace_app.command("inspect")
def trace_inspect(file: Path = FILE_ARG, fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT,
                  block_size: int = typer.Option(512, help="tokens per block for the block-granularity ratio"),
                  as_json: bool = JSON_OPT) -> None:
    """Requests, duration, rate, length percentiles and prefix sharing with an unbounded cache."""
    from poolsim.traces import inspect_trace

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
def trace_convert(file: Path = FILE_ARG, out: Path = OUT_ARG, fmt: Optional[str] = FORMAT_OPT,
                  skip_bad_lines: bool = SKIP_OPT,
                  force: bool = FORCE_OPT, as_json: bool = JSON_OPT) -> None:
    """Write any trace in poolsim's own JSONL format."""
    with _one_line_errors():
        _check_out(out, force, file)
        _wrote(_load(file, fmt, skip_bad_lines), out, as_json, force)


@trace_app.command("slice")
def trace_slice(file: Path = FILE_ARG, out: Path = OUT_ARG, start: float = typer.Option(0.0, help="window start (s)"),
                end: float = typer.Option(math.inf, help="window end (s, exclusive)"),
                rebase: bool = typer.Option(True, help="shift arrivals so the window starts at 0"),
                fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT, force: bool = FORCE_OPT,
                as_json: bool = JSON_OPT) -> None:
    """Keep the requests arriving in [start, end)."""
    from poolsim.traces import slice_trace

    with _one_line_errors():
        if not (math.isfinite(start) and 0 <= start < end) or math.isnan(end):
            raise ValueError(f"--start {start:g} --end {end:g}: need 0 <= --start < --end (seconds)")
        _check_out(out, force, file)
        _wrote(slice_trace(_load(file, fmt, skip_bad_lines), start, end, rebase), out, as_json, force,
               f"{file} has no request arriving in [{start:g} s, {end:g} s)")


@trace_app.command("scale")
def trace_scale(file: Path = FILE_ARG, out: Path = OUT_ARG,
                factor: Optional[float] = typer.Option(None, help="rate multiplier"),
                rate: Optional[float] = typer.Option(None, help="target mean rate (req/s) instead of a factor"),
                fmt: Optional[str] = FORMAT_OPT, skip_bad_lines: bool = SKIP_OPT, force: bool = FORCE_OPT,
                as_json: bool = JSON_OPT) -> None:
    """Speed a trace up or slow it down (arrival times divided by the factor)."""
    from poolsim.traces import mean_rate, scale_trace

    with _one_line_errors():
        if (factor is None) == (rate is None):
            raise ValueError("give exactly one of --factor and --rate")
        _check_out(out, force, file)
        trace = _load(file, fmt, skip_bad_lines)
        _wrote(scale_trace(trace, factor if factor is not None else rate / mean_rate(trace)), out, as_json, force)


@trace_app.command("generate")
def trace_generate(
    out: Path = OUT_ARG,
    preset: str = typer.Option("chat", help="chat or agent: the defaults every other flag overrides"),
    seed: int = typer.Option(0, help="random seed: the same seed and flags give the same trace"),
    sessions: Optional[int] = typer.Option(None, help="number of sessions"),
    rate: Optional[str] = typer.Option(None, help="session starts: N per s, step:T=R,... or diurnal:MEAN,AMP "
                                                  "(optionally ,PERIOD)"),
    cv: Optional[float] = typer.Option(None, help="burstiness of session starts (1 = Poisson, >1 = gamma, burstier)"),
    turns: Optional[str] = typer.Option(None, help="requests per session (a length spec, e.g. uniform:1,6)"),
    think_time: Optional[float] = typer.Option(None, help="mean seconds between a session's turns"),
    system_prompt_len: Optional[int] = typer.Option(None, help="tokens of the shared system prompt / context"),
    system_prompt_fanout: Optional[int] = typer.Option(None, help="sessions sharing each system prompt"),
    input_len: Optional[str] = typer.Option(None, help="new user tokens per turn: fixed:N, uniform:LO,HI, "
                                                        "lognormal:MED,SIGMA (optionally ,LO,HI), "
                                                        "empirical:input,TRACE"),
    output_len: Optional[str] = typer.Option(None, help="output tokens per turn (same specs)"),
    max_new_tokens: Optional[int] = typer.Option(None, help="the client's limit; outputs are clipped to it"),
    ignore_eos: bool = typer.Option(False, help="every output runs to --max-new-tokens"),
    max_prompt_len: Optional[int] = typer.Option(None, help="a session ends before a longer prompt"),
    force: bool = FORCE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Generate a seeded synthetic workload (multi-turn chats or agent loops) in poolsim's format."""
    from poolsim.traces import agent_spec, chat_spec, generate, parse_length, parse_rate

    with _one_line_errors():
        _check_out(out, force)
        presets = {"chat": chat_spec, "agent": agent_spec}
        if preset not in presets:
            raise ValueError(f"unknown preset {preset!r}: chat or agent")
        for flag, value in (("--sessions", sessions), ("--system-prompt-fanout", system_prompt_fanout),
                            ("--max-new-tokens", max_new_tokens), ("--max-prompt-len", max_prompt_len)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} {value}: must be >= 1")
        for flag, value in (("--cv", cv), ("--think-time", think_time)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{flag} {value}: must be a finite number >= 0")
        if system_prompt_len is not None and system_prompt_len < 0:
            raise ValueError(f"--system-prompt-len {system_prompt_len}: must be >= 0")
        given = dict(num_sessions=sessions, cv=cv, think_time_s=think_time, system_prompt_len=system_prompt_len,
                     system_prompt_fanout=system_prompt_fanout, max_new_tokens=max_new_tokens,
                     max_prompt_len=max_prompt_len, ignore_eos=ignore_eos or None,
                     rate=None if rate is None else parse_rate(rate),
                     turns=None if turns is None else parse_length(turns),
                     input_len=None if input_len is None else parse_length(input_len),
                     output_len=None if output_len is None else parse_length(output_len))
        spec = presets[preset](**{k: v for k, v in given.items() if v is not None})
        _wrote(generate(spec, seed=seed, name=out.stem), out, as_json, force)

@app.command()
def report(
    run_dir: str = typer.Argument(..., metavar="DIR", help="A run folder written by `poolsim run --out DIR`."),
    compare: list[str] = typer.Option([], "--compare", metavar="OTHER_DIR",
                                      help="Another run folder to compare with (repeatable)."),
    out: str | None = typer.Option(None, "--out", metavar="DIR", help="Where to write the page (default: DIR)."),
    as_json: bool = typer.Option(False, "--json", help="Print the page's path and the runs as one JSON object."),
) -> None:
    """Re-render a run's HTML report (and PNGs) from its saved data; with --compare, a side-by-side page."""
    from poolsim.app.output import publish_dir, recording, report_target
    from poolsim.reports.html import ReportError, render_comparison, render_report

    def render(target):
        return (render_comparison([run_dir, *compare], target or run_dir) if compare
                else render_report(run_dir, target))

    try:
        target = report_target(run_dir, compare, out)
        if target is None:  # the page goes into a folder poolsim wrote, beside the runs it reads
            with recording(out or run_dir):
                page = render(out)
        else:
            with publish_dir(target) as tmp:
                page = Path(target) / render(tmp).name
    except (ReportError, ValueError, OSError) as e:
        _fail(e)
    if as_json:
        typer.echo(json.dumps({"page": str(page), "runs": [run_dir, *compare]}))
        return
    typer.echo(str(page))


def _bench_list(flag: str, text: str, parse) -> list:
    try:
        return [parse(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a value or a comma-separated list") from None


@app.command()
@with_server_options
@stoppable()
def bench(
    server: dict,
    dataset_name: str = typer.Option("random-ids", "--dataset-name",
                                     help="random-ids|random|sharegpt (random, sharegpt: need --dataset-path)."),
    dataset_path: Optional[Path] = typer.Option(None, "--dataset-path", help="ShareGPT JSON (random, sharegpt)."),
    standin: bool = typer.Option(False, "--standin-prompts",
                                 help="random without a ShareGPT file: one stand-in text per prompt index."),
    num_prompts: int = typer.Option(1000, "--num-prompts", help="Number of prompts to process."),
    random_input_len: int = typer.Option(1024, "--random-input-len",
                                         help="Number of input tokens per request (random datasets)."),
    random_output_len: int = typer.Option(1024, "--random-output-len",
                                          help="Number of output tokens per request (random datasets)."),
    random_range_ratio: float = typer.Option(0.0, "--random-range-ratio",
                                            help="Range of sampled ratio of input/output length (random)."),
    range_style: str = typer.Option("sglang", "--random-range-style",
                                    help="sglang: lengths in [max(L*r,1), L]; vllm: [L*(1-r), L*(1+r)]; "
                                         "sglang-legacy: outputs in [L*r, L] (older clients)."),
    sharegpt_output_len: Optional[int] = typer.Option(None, "--sharegpt-output-len",
                                                      help="Output length for each request (overrides ShareGPT's)."),
    sharegpt_context_len: Optional[int] = typer.Option(None, "--sharegpt-context-len",
                                                       help="Requests longer than this are dropped (ShareGPT)."),
    request_rate: str = typer.Option("inf", "--request-rate",
                                     help="req/s (Poisson) or inf; a comma list runs back to back."),
    burstiness: float = typer.Option(1.0, "--burstiness", help="vLLM's gamma shape (1: SGLang's Poisson)."),
    max_concurrency: Optional[str] = typer.Option(None, "--max-concurrency",
                                                  help="at most N in flight; a comma list runs back to back."),
    seed: int = typer.Option(42, "--seed", help="The random seed."),
    warmup_requests: int = typer.Option(1, "--warmup-requests",
                                        help="Number of warmup requests to run before the benchmark."),
    flush_cache: bool = typer.Option(False, "--flush-cache", help="/flush_cache after each run's warm-up."),
    tokenizer_vocab_size: Optional[int] = typer.Option(None, "--tokenizer-vocab-size",
                                                       help="random-ids: the tokenizer's vocab_size "
                                                            "(default: the model config's)."),
    router: str = typer.Option("round_robin", "--router", help="dp router: round_robin|cache_aware."),
    step_time: str = typer.Option("analytic", "--step-time", help="analytic, or fixed:MILLISECONDS."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Step-time coefficients (JSON)."),
    as_json: bool = typer.Option(False, "--json", help="bench_serving's result dict(s) as JSON."),
) -> None:
    """SGLang's bench_serving against the simulated server: its datasets, rates, concurrency and printout."""
    from poolsim.app.bench_serving import bench_configs, format_result, run_bench
    from poolsim.app.run import check_step_time
    from poolsim.app.server import load_server
    from poolsim.pools.errors import PoolError

    try:
        check_step_time(step_time, calibration)
        if tokenizer_vocab_size is not None and tokenizer_vocab_size < 1:
            raise ValueError(f"--tokenizer-vocab-size {tokenizer_vocab_size}: must be >= 1")
        rates = _bench_list("--request-rate", request_rate, float)
        limits = _bench_list("--max-concurrency", max_concurrency, int) if max_concurrency else [None]
        configs = bench_configs(rates, limits, dataset_name=dataset_name, num_prompts=num_prompts,
                                random_input_len=random_input_len, random_output_len=random_output_len,
                                random_range_ratio=random_range_ratio, seed=seed, warmup_requests=warmup_requests,
                                flush_cache=flush_cache, dataset_path=str(dataset_path) if dataset_path else None,
                                sharegpt_output_len=sharegpt_output_len, sharegpt_context_len=sharegpt_context_len,
                                burstiness=burstiness, range_style=range_style, sharegpt_standin=standin)
        model, gpu, args, overhead = load_server(server)
        total = sum(c.num_prompts + c.warmup_requests for c in configs)
        if not as_json and total >= 10_000:  # drawing a million prompts takes a while too: say so first
            typer.echo(f"drawing {total:,} prompts ({', '.join(sorted({c.dataset_name for c in configs}))}) ...",
                       err=True)
        with RunProgress(total, f"bench {model.name}", show=not as_json) as progress:
            sim_result, results = run_bench(configs, model, gpu, args, step_time=step_time, router=router,
                                            calibration=str(calibration) if calibration else None,
                                            runtime_overhead_gib=overhead, vocab_size=tokenizer_vocab_size,
                                            progress=progress)
    except (ValueError, OSError) as e:
        _fail(e)
    except (RuntimeError, PoolError) as e:
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else results, indent=2, default=float))
        return
    typer.echo("\n\n".join(format_result(m) for m in results))
    if sim_result.summary.get("speculative_algorithm"):
        typer.echo(f"speculative decoding: {_speculative_row(sim_result.summary)}")
    typer.echo(f"time model: {sim_result.run['step_time_model']}")


# ---------------------------------------------------------------- device replay: calibrate / validate
def _replay(server: dict, trace, fmt, device, tiny, layers, max_steps, budget_s, triton_steps, seed, out,
            calibration, refit, repeat=1):
    """Shared by calibrate and validate: the trace through the pools on a device (kernels.calibrate)."""
    import os

    from poolsim.app.server import load_server
    from poolsim.kernels.replay import PoolMismatch, ReplayOptions
    from poolsim.pools.errors import PoolError

    if device == "cpu" and triton_steps:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a Triton kernel module is first imported
    try:
        import torch
    except ImportError:
        _fail(ValueError("calibrate/validate need torch (pip install 'poolsim[gpu]')"))
    try:
        torch.device(device)
    except RuntimeError as e:
        _fail(ValueError(f"--device {device!r}: {e}"))
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        _fail(ValueError(f"--device {device}: no CUDA device here (use --device cpu --tiny for the CPU path)"))
    from poolsim.kernels.calibrate import calibrate as run_calibration

    opts = ReplayOptions(device=device, tiny=tiny, layers=layers or ("unit" if tiny else "full"),
                         max_steps=max_steps, budget_s=budget_s, triton_steps=triton_steps, seed=seed,
                         repeat=repeat)
    if repeat < 1:
        _fail(ValueError(f"--repeat {repeat}: expected 1 or more runs"))
    try:
        loaded = _load_trace(trace, fmt, False)
        info = {"path": str(loaded.source_path or trace or ""), "name": loaded.name, "format": loaded.format,
                "requests": len(loaded)}
        model, gpu, args, overhead = load_server(server)
        return run_calibration(loaded, model, gpu, args, out=out, opts=opts, trace_info=info,
                               runtime_overhead_gib=overhead, calibration=str(calibration) if calibration else None,
                               refit=refit, log=typer.echo)
    except PoolMismatch as e:
        typer.echo(f"error: pool check failed: {e}", err=True)
        raise typer.Exit(1)
    except (ValueError, OSError) as e:
        _fail(e)
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(e):
            # the host or device ran out, not the simulated server: say what to shrink
            _fail(RuntimeError(f"--device {device}: the replay ran out of memory ({str(e).splitlines()[0]}); its "
                               "pools are allocated at the planned sizes: use a smaller pool (--max-total-tokens, "
                               "--max-running-requests, --context-length), --layers unit or a shorter trace"))
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))
    except PoolError as e:
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))


DEVICE_OPT = typer.Option("cuda:0", "--device", help="torch device the pools and the stand-in forward run on.")
TINY_OPT = typer.Option(False, "--tiny", help="CI size: small hidden size, few heads, experts and layers "
                                             "(on a CPU the timer is synthetic: a test fixture).")
LAYERS_OPT = typer.Option(None, "--layers", help="full | unit (one layer per kind, scaled) | N per kind "
                                                  "(default: full; unit with --tiny).")
MAX_STEPS_OPT = typer.Option(None, "--max-steps", help="Measure at most N steps (pools are checked on every step).")
BUDGET_OPT = typer.Option(None, "--budget-s", help="Stop measuring after S seconds of replay.")
REPEAT_OPT = typer.Option(1, "--repeat", help="Replay N times; runs 2.. are compared with the first (per-kind "
                                                "median step time, fitted coefficients; they agree within 3 %).")
TRITON_OPT = typer.Option(3, "--triton-steps", help="Run the first N measured steps through the Triton kernels "
                                                    "(TRITON_INTERPRET=1 on a CPU).")
MEASURED_OPT = typer.Option([], "--measured", metavar="FILE", help="A real SGLang server's telemetry (repeatable): "
                            "forward-pass metrics JSONL (`poolsim record`), server logs, bench_serving results.")
DECODE_LOG_INTERVAL_OPT = typer.Option(40, "--decode-log-interval", help="The server's --decode-log-interval "
                                                                         "(server logs).")


@app.command()
@with_server_options
@stoppable(keeps_files=True)
def calibrate(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file; default: the bundled trace."),
    fmt: Optional[str] = FORMAT_OPT,
    device: str = DEVICE_OPT, tiny: bool = TINY_OPT, layers: Optional[str] = LAYERS_OPT,
    max_steps: Optional[int] = MAX_STEPS_OPT, budget_s: Optional[float] = BUDGET_OPT,
    triton_steps: int = TRITON_OPT, seed: int = typer.Option(0, "--seed", help="Stand-in weights and routing."),
    out: Path = typer.Option(..., "--out", help="Folder for calibration.json, steps.csv, report.md, calibration.png."),
    repeat: int = REPEAT_OPT,
    measured: list[Path] = MEASURED_OPT,
    decode_log_interval: int = DECODE_LOG_INTERVAL_OPT,
) -> None:
    """Replay a trace through the pools and kernels on a device, fit the step-time model, write calibration.json.
    With --measured: fit it from a real SGLang server's telemetry instead (no device)."""
    if measured:
        if trace is not None:
            _fail(ValueError("--measured fits a server's telemetry; a trace is for the device replay: give one"))
        return _calibrate_measured(server, measured, decode_log_interval, out)
    rec = _replay(server, trace, fmt, device, tiny, layers, max_steps, budget_s, triton_steps, seed, out, None, True,
                  repeat)
    f = rec["fit"]
    se = f.get("rel_se") or {}
    fitted = ", ".join(f"{n} (+-{se[n]:.1%})" if n in se else n for n in f["fitted"])
    typer.echo(f"fit: {fitted or f.get('note') or 'nothing identifiable'}; MAPE train {f['mape_train']:.2%}, "
               f"held-out {f['mape_heldout']:.2%} (before: {f['before']['mape_heldout']:.2%}); "
               f"pool check {rec['pool_check']['steps']} steps, {rec['pool_check']['mismatches']} mismatches; "
               f"{rec['wall_s']:.1f} s")
    if rec.get("repeat"):
        r = rec["repeat"]
        typer.echo(f"two runs agree: {'yes' if r['agree'] else 'NO'} (max relative difference {r['max_rel_diff']:.2%}, "
                   f"threshold {r['threshold']:.0%}, {r['runs']} runs)")
    if rec["fixture_only"]:
        typer.echo("synthetic timer: this calibration is a test fixture, not a GPU measurement")
    typer.echo(f"wrote {out}/calibration.json (use: poolsim run --calibration {out}/calibration.json)")


@app.command()
@with_server_options
def validate(
    server: dict,
    trace: Optional[Path] = typer.Argument(None, help="Trace file; default: the bundled trace."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="calibration.json from `poolsim "
                                               "calibrate` (with --measured, optional: default the shipped one)."),
    fmt: Optional[str] = FORMAT_OPT,
    device: str = DEVICE_OPT, tiny: bool = TINY_OPT, layers: Optional[str] = LAYERS_OPT,
    max_steps: Optional[int] = MAX_STEPS_OPT, budget_s: Optional[float] = BUDGET_OPT,
    triton_steps: int = TRITON_OPT, seed: int = typer.Option(0, "--seed", help="Stand-in weights and routing."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the step table and report here (with "
                                       "--measured: validation.html, validation.json, steps.csv)."),
    measured: list[Path] = MEASURED_OPT,
    decode_log_interval: int = DECODE_LOG_INTERVAL_OPT,
    as_json: bool = typer.Option(False, "--json", help="With --measured: print one JSON object."),
    bench_seed: Optional[int] = typer.Option(None, "--bench-seed", help="With --measured bench_serving results: "
                                             "their --seed (not in the result; default 42, bench_serving's)."),
    dataset_path: Optional[Path] = typer.Option(None, "--dataset-path", help="With --measured bench_serving "
                                                "results: the ShareGPT JSON of random / sharegpt runs."),
) -> None:
    """Replay a trace on a device and print predicted (from --calibration) vs measured step times; no refit.
    With --measured: poolsim against a real SGLang server's telemetry (per step, and per bench_serving run)."""
    if measured:
        return _validate_measured(server, measured, decode_log_interval, calibration, as_json, bench_seed,
                                  dataset_path, out)
    if calibration is None:
        _fail(ValueError("--calibration is required (the file to validate), or --measured FILE"))
    rec = _replay(server, trace, fmt, device, tiny, layers, max_steps, budget_s, triton_steps, seed, out,
                  calibration, False)
    f = rec["fit"]
    typer.echo(f"{'step kind':<10} {'steps':>6} {'MAPE':>8} {'p90 |err|':>10}")
    for kind, s in f["by_kind"].items():
        typer.echo(f"{kind:<10} {s['n']:>6} {s['mape']:>8.2%} {s['p90_abs_error']:>10.2%}")
    e2e = f["end_to_end"]
    typer.echo(f"end to end: predicted {e2e['predicted_s']:.4g} s, measured {e2e['measured_s']:.4g} s, "
               f"error {e2e['error']:+.2%}; MAPE {f['mape']:.2%} over {f['n']} steps")


# ---------------------------------------------------------------- a real server's telemetry


def _calibrate_measured(server: dict, paths: list[Path], decode_log_interval: int, out: Path) -> None:
    from poolsim.app.server import load_server
    from poolsim.telemetry import TelemetryError, load_measured
    from poolsim.telemetry.fit import calibrate_measured
    from poolsim.telemetry.summary import calibrate_lines

    try:
        steps, runs = load_measured(paths, decode_log_interval)
        if not steps:
            raise ValueError("--measured: no forward-pass metrics or server log among the files (bench_serving "
                             "results are per run: `poolsim validate --measured` compares them)")
        model, gpu, args, overhead = load_server(server)
        rec = calibrate_measured(steps, model, gpu, args, runtime_overhead_gib=overhead, out=out, log=typer.echo)
    except (TelemetryError, ValueError, OSError) as e:
        _fail(e)
    typer.echo("\n".join(calibrate_lines(rec, out)))


def _validate_measured(server, paths, decode_log_interval, calibration, as_json, bench_seed, dataset_path,
                       out=None) -> None:
    from poolsim.app.server import load_server
    from poolsim.kernels.calibrate import OutputDir
    from poolsim.pools.errors import PoolError
    from poolsim.telemetry import TelemetryError, load_measured
    from poolsim.telemetry.summary import validate_lines
    from poolsim.telemetry import validate as val

    try:
        # checked before any work: a folder holding anything validate does not write is refused
        outdir = OutputDir(out, val.OUTPUT_FILES, "validate --measured") if out is not None else None
        steps, runs = load_measured(paths, decode_log_interval)
        model, gpu, args, overhead = load_server(server)
        result, table = val.validate_steps_table(steps, model, gpu, args, calibration=calibration,
                                                 runtime_overhead_gib=overhead) if steps else ({}, None)
        pairs = []
        if runs:
            result["runs"], pairs = val.validate_runs_detail(runs, model, gpu, args, calibration=calibration,
                                                             runtime_overhead_gib=overhead, seed=bench_seed,
                                                             dataset_path=dataset_path)
        config = val.page_config(model, gpu, args, calibration=calibration,
                                 runtime_overhead_gib=overhead) if outdir is not None else None
    except (TelemetryError, ValueError, OSError) as e:
        _fail(e)
    except (RuntimeError, PoolError) as e:
        _fail(RuntimeError(f"the simulated SGLang server fails here as the real one would: {e}"))
    if outdir is not None:
        try:
            val.write_validation(outdir, result, table, pairs, config)
        except OSError as e:
            _fail(ValueError(f"--out {out}: {e}"))
    if as_json:
        typer.echo(val.result_json(result))
        return
    typer.echo("\n".join(validate_lines(result)))
    if outdir is not None:
        typer.echo(f"wrote {out / 'validation.html'}")


@app.command()
def record(
    fpm: list[str] = typer.Option(..., "--fpm", metavar="ENDPOINT", help="The server's forward-pass metrics "
                                  "endpoint, BASE.RANK (repeatable: one per dp rank), e.g. ipc:///tmp/fpm.0."),
    out: Path = typer.Option(..., "--out", help="JSONL file to write (must not exist)."),
    max_messages: Optional[int] = typer.Option(None, "--max-messages", help="Stop after N messages."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Stop after S seconds."),
) -> None:
    """Subscribe to a running SGLang server's forward-pass metrics (--enable-forward-pass-metrics) and write them as
    JSONL, one ForwardPassMetrics per line with a receive timestamp (pip install 'poolsim[telemetry]')."""
    from poolsim.telemetry.record import record as run_record
    from poolsim.telemetry.summary import record_line

    try:
        summary = run_record(fpm, out, max_messages=max_messages, duration_s=duration)
    except (ValueError, OSError) as e:
        _fail(e)
    typer.echo(record_line(summary))


if __name__ == "__main__":
    app()
