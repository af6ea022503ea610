"""A run folder -> one self-contained HTML page (figures embedded as PNG data URIs) plus the PNGs and summary.csv.

    render_report(DIR)                   DIR/report.html, DIR/figures/<name>.png, DIR/summary.csv
    render_comparison([A, B], OUT)       OUT/comparison.html, OUT/figures/compare_<name>.png, OUT/comparison.csv
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from matplotlib.backends.backend_agg import FigureCanvasAgg

from poolsim.app.output import read_run, run_files, table_path
from poolsim.reports import plots
from poolsim.reports.tables import (
    comparison_config,
    comparison_summary,
    configuration,
    definitions_for_page,
    get_path,
    metric_link,
    summary_rows,
    summary_tables,
    verdict_facts,
    verdict_state,
    would_fit_fact,
)
from poolsim.sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS

TEMPLATES = Path(__file__).with_name("templates")
DPI = 100  # PNG pixels per figure inch
REQUEST_DERIVED = ("ttft_s", "e2e_s", "itl_s")


class ReportError(ValueError):
    """Bad input for a report: the message is one line naming the folder or file."""


@dataclass
class Run:
    dir: Path
    steps: pd.DataFrame
    requests: pd.DataFrame
    summary: dict
    run: dict

    @property
    def label(self) -> str:
        # NOTE: write_run renders into a temporary ".NAME-xxxxxxxx" folder that it then renames to NAME
        hidden = re.fullmatch(r"\.(.+)-[a-z0-9_]{8}", self.dir.name)
        return hidden.group(1) if hidden else self.dir.name


# ---------------------------------------------------------------- loading
def load_run(run_dir: str | Path) -> Run:
    """Read and check a run folder; ReportError (one line) for anything missing or unreadable."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ReportError(f"{d}: no such run folder")
    for name in ("summary.json", "run.json"):
        path = d / name
        if path.exists():
            try:
                json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ReportError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
            except UnicodeDecodeError:
                raise ReportError(f"{path}: not a text file (binary content where JSON belongs)") from None
    tables = {t: table_path(d, t) for t in ("steps", "requests")}
    for path in tables.values():
        if path.exists() and path.stat().st_size == 0:
            raise ReportError(f"{path}: empty file")
    try:
        steps, requests, summary, run = read_run(d)
    except FileNotFoundError as e:
        raise ReportError(str(e)) from None
    except (ValueError, pd.errors.ParserError) as e:
        raise ReportError(f"{d}: cannot read the run ({str(e).splitlines()[0]})") from None
    _require_columns(tables["steps"], steps, STEP_COLUMNS)
    _require_columns(tables["requests"], requests, REQUEST_COLUMNS + REQUEST_DERIVED)
    if not isinstance(summary, dict) or not isinstance(run, dict):
        raise ReportError(f"{d}: summary.json and run.json must each hold a JSON object")
    for key in ("verdict", "pools.kv.capacity", "pools.rows.capacity"):
        if get_path(summary, key) is None:
            raise ReportError(f"{d / 'summary.json'}: missing {key}")
    for name, path, df, text in (("steps", tables["steps"], steps, STEP_TEXT_COLUMNS),
                                 ("requests", tables["requests"], requests, REQUEST_TEXT_COLUMNS)):
        _require_numbers(path, df, [c for c in df.columns if c not in text])
        expected = summary.get(name)
        if isinstance(expected, int) and expected != len(df):
            raise ReportError(f"{path}: {len(df):,} rows, but summary.json counts {expected:,} {name}: the file is "
                              "cut short or belongs to another run")
    requests["aborted"] = requests["aborted"].astype(str).str.lower().isin(["true", "1"])
    return Run(d, steps, requests, summary, run)


# Columns that hold text; every other saved column is a number (NaN where a value does not apply).
STEP_TEXT_COLUMNS = frozenset({"kind"})
REQUEST_TEXT_COLUMNS = frozenset({"admission_steps", "cached_tokens", "aborted", "finished_reason", "abort_cause"})


def _require_numbers(path: Path, df: pd.DataFrame, columns) -> None:
    """One line naming the file, line (row for Parquet) and column of the first value that is not a number."""
    for column in columns:
        values = df[column]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            continue
        bad = values.notna() & pd.to_numeric(values, errors="coerce").isna()
        if bad.any():
            i = int(bad.to_numpy().argmax())
            where = f"line {i + 2}" if path.suffix == ".csv" else f"row {i + 1}"  # CSV: the header is line 1
            raise ReportError(f"{path}: {where}: column {column!r}: {values.iloc[i]!r} is not a number")


def _require_columns(path: Path, df: pd.DataFrame, columns) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ReportError(f"{path}: missing columns {', '.join(missing)}")


# ---------------------------------------------------------------- figures
@dataclass
class FigureSpec:
    name: str
    title: str
    caption: str
    metrics: tuple[str, ...]  # qualified names linked under the figure
    make: Callable[[], object]


def run_figures(r: Run) -> list[FigureSpec]:
    s, q, summary, run = r.steps, r.requests, r.summary, r.run
    cell = get_path(run, "memory_plan.cell_size_bytes")
    reps = plots.num_replicas(s, q)
    mamba = ("figures.mamba_own", "steps.mamba_evictable_states") if "mamba" in summary["pools"] else ()
    swa = (("figures.swa_own", "steps.swa_protected_size", "steps.swa_evictable_size", "steps.swa_available_size")
           if "swa" in summary["pools"] else ())
    specs = [
        FigureSpec("memory_timeline", "Memory per pool over time",
                   "Stacked: what holds each pool's capacity at the busiest step of each time bin. Red lines: steps "
                   "that retracted requests; black dashed: aborts.",
                   ("figures.kv_own", "steps.protected_size", "steps.evictable_size", "steps.available_size",
                    "steps.free_req_rows", *mamba, *swa, "steps.retracted", "requests.aborted", "figures.time_bin"),
                   lambda: plots.plot_memory_timeline(s, q, summary["pools"], cell)),
        FigureSpec("queue", "Running and waiting requests",
                   "Requests holding a request row and requests waiting for admission (peak of each time bin).",
                   ("steps.running", "steps.waiting", "summary.pools.rows.capacity"),
                   lambda: plots.plot_queue(s, summary["pools"]["rows"]["capacity"] * reps)),
        FigureSpec("prefix_cache", "Prefix-cache hit rate",
                   "Left: share of prefill tokens reused from the radix cache, per time bin and cumulative. "
                   "Right: per finished request, the share of its prompt found in the cache at first admission.",
                   ("figures.hit_rate_binned", "figures.request_hit_frac", "summary.cache_hit_rate"),
                   lambda: plots.plot_prefix_cache(s, q)),
        FigureSpec("latency", "Latency distributions",
                   "Finished requests; vertical lines mark p50, p90 and p99 (values in the legends).",
                   ("requests.ttft_s", "requests.itl_s", "requests.e2e_s", "summary.ttft_s.p99"),
                   lambda: plots.plot_latency(q)),
        FigureSpec("fragmentation", "Fragmentation",
                   "Memory held that does no work: unfilled slots of partial pages, KV computed but not kept by the "
                   "cache, the request-row table reserved against what is used, and idle mamba slots.",
                   ("steps.partial_page_tokens", "requests.tokens_not_cached",
                    "summary.fragmentation.req_to_token_bytes_reserved",
                    "summary.fragmentation.req_to_token_mean_used_frac",
                    *(("summary.pools.mamba.mean_idle_slots",) if mamba else ())),
                   lambda: plots.plot_fragmentation(s, q, summary)),
    ]
    if "host_used_size" in s and summary.get("hicache"):
        specs.append(FigureSpec(
            "hicache", "HiCache: hits per tier and the host pool",
            "Top: share of prefill tokens matched on the GPU and loaded back from the host pool, per time bin. "
            "Bottom: host slots the tree holds (each bin's peak) against the host pool, and the tokens written to "
            "and loaded from host in each bin.",
            ("summary.cached_prefill_tokens_by_tier.host", "steps.host_used_size", "steps.host_written_tokens",
             "steps.host_loaded_tokens", "summary.hicache.host_capacity_tokens", "figures.hit_rate_by_tier"),
            lambda: plots.plot_hicache(s, summary)))
    compare = run.get("hybrid_compare")
    if isinstance(compare, dict) and "context_len" in compare:
        specs.append(FigureSpec(
            "hybrid_compare", "Hybrid vs full attention",
            "Memory per request and the most concurrent requests against context length: the hybrid model's fixed "
            "linear-attention state plus MLA KV, against a model with MLA in every layer.",
            ("figures.bytes_per_request", "figures.max_concurrency", "run.hybrid_compare"),
            lambda: plots.plot_hybrid_compare(compare, str(run.get("model", "hybrid")))))
    return specs


def save_figures(specs: list[FigureSpec], fig_dir: Path) -> list[dict]:
    """Draw each figure once: PNG in ``fig_dir`` and as a data URI for the page."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for spec in specs:
        fig = spec.make()
        buf = io.BytesIO()
        FigureCanvasAgg(fig)
        fig.savefig(buf, format="png", dpi=DPI)
        png = buf.getvalue()
        (fig_dir / f"{spec.name}.png").write_bytes(png)
        width, height = (round(v * DPI) for v in fig.get_size_inches())
        out.append({"name": spec.name, "title": spec.title, "caption": spec.caption,
                    "links": [metric_link(m, m.split(".", 1)[1]) for m in spec.metrics],
                    "src": "data:image/png;base64," + base64.b64encode(png).decode("ascii"),
                    "file": f"{fig_dir.name}/{spec.name}.png", "width": width, "height": height})
    return out


# ---------------------------------------------------------------- pages
def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.globals["m"] = metric_link
    return env


def _write_csv(path: Path, header: list[str], rows) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _title(run: dict, fallback: str) -> str:
    """``llama-3.1-70b on 8x H100 80GB SXM (tp 8)``: the model, the whole server's GPUs and its parallelism."""
    flags = run.get("server_args") if isinstance(run.get("server_args"), dict) else {}
    tp, dp = flags.get("tp_size") or 1, flags.get("dp_size") or 1
    gpu = run.get("gpu")
    if gpu and isinstance(tp, int) and isinstance(dp, int):
        layout = ", ".join(f"{k} {v}" for k, v in (("tp", tp), ("dp", dp)) if v > 1)
        gpu = (f"{tp * dp}x " if tp * dp > 1 else "") + str(gpu) + (f" ({layout})" if layout else "")
    parts = [str(x) for x in (run.get("model"), gpu) if x]
    return " on ".join(parts) if parts else fallback


def render_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``report.html`` (self-contained), ``figures/*.png`` and ``summary.csv`` for a run folder;
    into ``out_dir`` if given, else into the run folder. Returns the page's path."""
    r = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else r.dir
    out.mkdir(parents=True, exist_ok=True)
    figures = save_figures(run_figures(r), out / "figures")
    _write_csv(out / "summary.csv", ["metric", "value", "unit"],
               [(n.split(".", 1)[1], _csv_value(v), u) for n, v, u in summary_rows(r.summary)])
    page = _env().get_template("report.html.j2").render(
        title=_title(r.run, r.label), run_label=r.label, state=verdict_state(r.summary),
        verdict=r.summary["verdict"], facts=verdict_facts(r.summary) + would_fit_fact(r.run),
        config=configuration(r.run),
        figures=figures, tables=summary_tables(r.summary), definitions=definitions_for_page(),
        files=[{"name": f.name, "href": Path(os.path.relpath(f, out)).as_posix()}
               for f in run_files(r.dir) if f.exists()])
    path = out / "report.html"
    path.write_text(page)
    return path


def _csv_value(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return v


def _labels(runs: list[Run]) -> list[str]:
    labels, seen = [], {}
    for r in runs:
        seen[r.label] = seen.get(r.label, 0) + 1
        labels.append(r.label if seen[r.label] == 1 else f"{r.label} ({seen[r.label]})")
    return labels


def render_comparison(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """Two or more runs side by side: verdicts, configuration, overlay figures, summary table.
    Writes ``comparison.html``, ``figures/compare_*.png`` and ``comparison.csv`` into ``out_dir``."""
    if len(run_dirs) < 2:
        raise ReportError("a comparison needs at least two run folders")
    runs = [load_run(d) for d in run_dirs]
    labels = _labels(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = [
        FigureSpec("compare_memory", "Memory in use over time",
                   "KV held by requests and locked prefixes, and request rows in use, as a share of each run's "
                   "capacity (busiest step of each time bin).",
                   ("summary.pools.kv.peak_used_frac", "summary.pools.rows.peak_used_frac", "figures.time_bin"),
                   lambda: plots.plot_compare_memory({lab: (r.steps, r.summary) for lab, r in zip(labels, runs)})),
        FigureSpec("compare_latency", "Latency CDFs",
                   "Share of finished requests at or below each latency; dots mark p99.",
                   ("requests.ttft_s", "requests.itl_s", "requests.e2e_s", "summary.ttft_s.p99"),
                   lambda: plots.plot_compare_latency({lab: r.requests for lab, r in zip(labels, runs)})),
        FigureSpec("compare_throughput", "Throughput over time",
                   "Prompt tokens computed and output tokens decoded per second.",
                   ("figures.throughput_binned", "summary.output_tok_s"),
                   lambda: plots.plot_compare_throughput({lab: r.steps for lab, r in zip(labels, runs)})),
    ]
    figures = save_figures(specs, out / "figures")
    rows = comparison_summary([r.summary for r in runs])
    per_run = [{n: v for n, v, _ in summary_rows(r.summary)} for r in runs]
    units_of = {n: u for r in runs for n, _, u in summary_rows(r.summary)}
    _write_csv(out / "comparison.csv", ["metric", "unit", *labels],
               [(n.split(".", 1)[1], u, *[_csv_value(p.get(n)) for p in per_run]) for n, u in units_of.items()])
    cards = [{"label": lab, "title": _title(r.run, lab), "state": verdict_state(r.summary),
              "verdict": r.summary["verdict"], "facts": verdict_facts(r.summary)} for lab, r in zip(labels, runs)]
    page = _env().get_template("comparison.html.j2").render(
        title="Comparison: " + " vs ".join(labels), labels=labels, cards=cards, config=comparison_config([r.run for r in runs]),
        figures=figures, summary=rows, definitions=definitions_for_page())
    path = out / "comparison.html"
    path.write_text(page)
    return path
