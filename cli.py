"""poolsim command line: a thin typer layer over the library (trace -> sim -> pools -> metrics -> report)."""

from __future__ import annotations

import json
import math
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


if __name__ == "__main__":
    app()
