"""``poolsim validate --measured FILE... --out DIR``'s page, ``validation.html``: self-contained (figures embedded as
PNG data URIs), built from validate's result (what ``--json`` prints), its per-step table and the per-request TTFT
pairs (telemetry/validate.py). Verdict first, then the figures whose data exist, the tables, the configuration and
the definitions (reports/METRICS.md, section ``validation``).

    step sources        predicted vs measured step time (log-log, per kind, y = x and a +-10 % band);
                        the signed error over the steps in file order, with its histogram
    bench_serving runs  the signed error per metric and run; per request (--output-details) TTFT, poolsim vs
                        measured
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from poolsim.reports import definitions, tables, units
from poolsim.reports.html import DPI, _env
from poolsim.reports.plots import MAX_POINTS
from poolsim.telemetry.steps import KINDS

BAND_PCT = 10.0  # the band drawn around "predicted = measured"
KIND_COLORS = {"prefill": "#ff7f0e", "decode": "#3b75af", "mixed": "#2ca02c"}
# bench_serving metrics in the per-run error figure (the JSON and the tables have them all)
RUN_FIGURE_METRICS = (("output_throughput", "output tok/s"), ("median_ttft_ms", "TTFT p50"),
                      ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99"),
                      ("median_itl_ms", "ITL p50"), ("p99_itl_ms", "ITL p99"), ("median_e2e_latency_ms", "E2E p50"),
                      ("p99_e2e_latency_ms", "E2E p99"))
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # log-axis labels as 20, 50, 100 (not 2 x 10^1)
MAX_RUN_FACTS = 6  # runs named one by one under the verdict


def pct(x, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return units.DASH
    return f"{x:+.1f} %" if signed else f"{x:.1f} %"


def _m(name: str, label: str | None = None) -> Markup:
    return tables.metric_link(f"validation.{name}", label)


def run_label(run: dict) -> str:
    w = run["workload"]
    conc = w.get("max_concurrency")
    return (f"{Path(run['file']).name}:{run['line']} (rate {w['request_rate']}"
            + (f", concurrency {conc}" if conc else "") + ")")


def replayed(result: dict) -> list[dict]:
    return [r for r in result.get("runs", []) if "metrics" in r]


# ---------------------------------------------------------------- figures
def _thin(idx: np.ndarray, limit: int = MAX_POINTS) -> np.ndarray:
    """At most ``limit`` of ``idx``, evenly spread (a scatter of 10^5 points draws no more than one of 2 10^4)."""
    if len(idx) <= limit:
        return idx
    return idx[np.unique(np.linspace(0, len(idx) - 1, limit).round().astype(int))]


def _identity(ax, values: np.ndarray) -> None:
    """Log axes spanning ``values``, the line predicted = measured and the +-10 % band around it."""
    lo, hi = float(values.min()) / 1.25, float(values.max()) * 1.25
    ax.set_xscale("log")
    ax.set_yscale("log")
    x = np.geomspace(lo, hi, 64)
    ax.fill_between(x, x * (1 - BAND_PCT / 100), x * (1 + BAND_PCT / 100), color="#d0d7de", alpha=0.6, lw=0,
                    label=f"±{BAND_PCT:g} %")
    ax.plot(x, x, color="#57606a", lw=1, label="poolsim = measured")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.grid(True, which="major", color="#eaeef2", lw=0.6)
    for axis in (ax.xaxis, ax.yaxis):  # under one and a half decades: the minor ticks are labelled too
        axis.set_major_formatter(PLAIN)
        axis.set_minor_formatter(PLAIN if hi / lo < 30 else NullFormatter())


def plot_step_scatter(table: pd.DataFrame, median_abs: float | None) -> Figure:
    fig = Figure(figsize=(7.0, 6.2), layout="constrained")
    ax = fig.add_subplot()
    meas, pred = table["measured_s"].to_numpy(float) * 1e3, table["predicted_s"].to_numpy(float) * 1e3
    ok = (meas > 0) & (pred > 0) & np.isfinite(meas) & np.isfinite(pred)
    _identity(ax, np.concatenate([meas[ok], pred[ok]]))
    kinds = table["kind"].to_numpy()
    for kind in KINDS:
        sel = np.flatnonzero(ok & (kinds == kind))
        if len(sel):
            shown = _thin(sel)
            ax.scatter(meas[shown], pred[shown], s=10, alpha=0.6, lw=0, color=KIND_COLORS[kind],
                       label=f"{kind} ({len(sel):,})")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("poolsim step time (ms)")
    ax.set_title(f"median |error| {pct(median_abs)} over {len(table):,} steps")
    ax.legend(loc="upper left", fontsize=9)
    return fig


def _rolling_window(n: int) -> int:
    return max(5, n // 40) | 1  # odd: centred


def plot_step_drift(table: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(10.0, 4.4), layout="constrained")
    grid = fig.add_gridspec(1, 2, width_ratios=(5, 1))
    ax = fig.add_subplot(grid[0])
    hax = fig.add_subplot(grid[1], sharey=ax)
    err = table["error_pct"].to_numpy(float)
    finite = np.isfinite(err)
    lo, hi = np.percentile(err[finite], [0.5, 99.5]) if finite.any() else (0.0, 0.0)
    lo, hi = min(lo, -1.5 * BAND_PCT), max(hi, 1.5 * BAND_PCT)
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    ax.axhspan(-BAND_PCT, BAND_PCT, color="#d0d7de", alpha=0.5, lw=0, label=f"±{BAND_PCT:g} %")
    ax.axhline(0, color="#57606a", lw=0.8)
    kinds = table["kind"].to_numpy()
    i = np.arange(len(err))
    for kind in KINDS:
        sel = np.flatnonzero(finite & (kinds == kind))
        if len(sel):
            shown = _thin(sel)
            ax.scatter(i[shown], err[shown], s=6, alpha=0.5, lw=0, color=KIND_COLORS[kind], label=kind)
    w = _rolling_window(len(err))
    ax.plot(i, pd.Series(err).rolling(w, center=True, min_periods=1).median(), color="#1f2328", lw=1.4,
            label=f"rolling median ({w} steps)")
    files = table["file"].astype(str).to_numpy()
    for j in np.flatnonzero(files[1:] != files[:-1]) + 1:  # where the next file starts
        ax.axvline(j - 0.5, color="#8c959f", ls=":", lw=1)
        ax.text(j - 0.5, hi, f"{Path(files[j]).name} ", rotation=90, va="top", ha="right", fontsize=7,
                color="#57606a")
    outside = int((finite & ((err < lo) | (err > hi))).sum())
    ax.set_ylim(lo, hi)
    ax.set_xlim(-0.5, max(len(err) - 0.5, 0.5))
    ax.set_xlabel("step (file order)")
    ax.set_ylabel("error (%): 100 (poolsim / measured - 1)")
    ax.set_title("Signed step-time error over the steps" + (f" ({outside:,} beyond the axis)" if outside else ""))
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=8, ncol=5)
    hax.hist(np.clip(err[finite], lo, hi), bins=40, range=(lo, hi), orientation="horizontal", color="#8c959f")
    hax.axhspan(-BAND_PCT, BAND_PCT, color="#d0d7de", alpha=0.5, lw=0)
    hax.axhline(0, color="#57606a", lw=0.8)
    hax.set_xlabel("steps")
    hax.tick_params(labelleft=False)
    return fig


def plot_run_errors(runs: list[dict]) -> Figure:
    metrics = [(n, label) for n, label in RUN_FIGURE_METRICS if any(n in r["metrics"] for r in runs)]
    fig = Figure(figsize=(10.0, 4.6), layout="constrained")
    ax = fig.add_subplot()
    ax.axhspan(-BAND_PCT, BAND_PCT, color="#d0d7de", alpha=0.5, lw=0, label=f"±{BAND_PCT:g} %")
    ax.axhline(0, color="#57606a", lw=0.8)
    colors = matplotlib.colormaps["tab10"]
    width = 0.8 / len(runs)
    label_bars = len(runs) * len(metrics) <= 45
    for j, r in enumerate(runs):
        vals = np.array([np.nan if (r["metrics"].get(n) or {}).get("error_pct") is None
                         else r["metrics"][n]["error_pct"] for n, _ in metrics], dtype=float)
        x = np.arange(len(metrics)) - 0.4 + width * (j + 0.5)
        bars = ax.bar(x, np.nan_to_num(vals), width, color=colors(j % 10), label=run_label(r))
        if label_bars:
            ax.bar_label(bars, labels=["" if np.isnan(v) else f"{v:+.0f}" for v in vals], fontsize=7, padding=2)
    ax.set_xticks(np.arange(len(metrics)), [label.replace(" ", "\n", 1) for _, label in metrics])
    ax.set_ylabel("error (%): 100 (poolsim / measured - 1)")
    ax.set_title("Signed error per bench_serving metric and run")
    ax.margins(y=0.15)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    return fig


def plot_ttft_scatter(runs: list[dict], pairs: list[dict]) -> Figure:
    fig = Figure(figsize=(7.0, 6.2), layout="constrained")
    ax = fig.add_subplot()
    meas = [p["measured_s"] * 1e3 for p in pairs]
    pred = [p["poolsim_s"] * 1e3 for p in pairs]
    allm, allp = np.concatenate(meas), np.concatenate(pred)
    ok = (allm > 0) & (allp > 0)
    _identity(ax, np.concatenate([allm[ok], allp[ok]]))
    colors = matplotlib.colormaps["tab10"]
    for j, (r, m, p) in enumerate(zip(runs, meas, pred)):
        keep = np.flatnonzero((m > 0) & (p > 0))
        shown = _thin(keep)
        ax.scatter(m[shown], p[shown], s=12, alpha=0.7, lw=0, color=colors(j % 10),
                   label=f"{run_label(r)}: {len(keep):,}")
    ax.set_xlabel("measured TTFT (ms)")
    ax.set_ylabel("poolsim TTFT (ms)")
    err = 100 * (allp / allm - 1)
    ax.set_title(f"Per-request TTFT: median |error| {pct(float(np.median(np.abs(err))))} over {len(err):,} "
                 "requests")
    ax.legend(loc="upper left", fontsize=8)
    return fig


def embed(name: str, title: str, caption: str, metrics: tuple[str, ...], fig: Figure) -> dict:
    """A figure as the page's ``ui.figure`` macro takes it: PNG as a data URI, no file beside the page."""
    buf = io.BytesIO()
    FigureCanvasAgg(fig)
    fig.savefig(buf, format="png", dpi=DPI)
    width, height = (round(v * DPI) for v in fig.get_size_inches())
    return {"name": name, "title": title, "caption": caption, "links": [_m(n) for n in metrics],
            "src": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), "file": None,
            "width": width, "height": height}


def step_figures(result: dict, table: pd.DataFrame | None) -> list[dict]:
    if table is None or table.empty:
        return []
    e = result["step_time_error_pct"]
    return [
        embed("step_scatter", "Step time: poolsim vs measured",
              "One point per usable measured step: the server's time against poolsim's for the same composition, "
              f"coloured by step kind; the grey line is equality, the band ±{BAND_PCT:g} %. Log-log, ms.",
              ("measured_s", "predicted_s", "step_time_error_pct.median_abs"),
              plot_step_scatter(table, e["median_abs"])),
        embed("step_drift", "Step-time error over the steps",
              "Left: the signed error of each step in file order (dotted lines: the next file starts), with its "
              "rolling median, so drift over a run shows. Right: the same errors as a histogram.",
              ("error_pct", "step_time_error_pct.median_signed"), plot_step_drift(table)),
    ]


def run_figures(result: dict, pairs: list[dict | None]) -> list[dict]:
    runs = replayed(result)
    if not runs:
        return []
    figures = [embed("run_errors", "bench_serving runs: signed error per metric",
                     "Per run (bars) and bench_serving metric: poolsim's bench on the run's workload against the "
                     f"measured value; above 0, poolsim's number is the larger. Band: ±{BAND_PCT:g} %.",
                     ("runs.metrics.error_pct",), plot_run_errors(runs))]
    with_pairs = [(r, p) for r, p in zip(result.get("runs", []), pairs)
                  if p is not None and len(p["measured_s"])]
    if with_pairs:
        figures.append(embed(
            "ttft_scatter", "bench_serving runs: TTFT per request",
            "Runs with --output-details: each request's measured TTFT against poolsim's for the same request "
            f"(send order). Band: ±{BAND_PCT:g} %. Log-log, ms.", ("runs.per_request.ttft_error_pct",),
            plot_ttft_scatter([r for r, _ in with_pairs], [p for _, p in with_pairs])))
    return figures


# ---------------------------------------------------------------- verdict, tables
def verdict(result: dict) -> str:
    parts = []
    if "steps" in result:
        n, e = result["steps"], result["step_time_error_pct"]
        parts.append(f"poolsim's step time is within {pct(e['median_abs'])} (median |error|) of the server's "
                     f"{n:,} measured steps" if n else "no usable measured step in the step sources")
    if "runs" in result:
        ttft = [r["metrics"]["median_ttft_ms"]["error_pct"] for r in replayed(result)
                if (r["metrics"].get("median_ttft_ms") or {}).get("error_pct") is not None]
        if not replayed(result):
            parts.append("no bench_serving run could be replayed")
        elif len(set(ttft)) == 1:
            parts.append(f"bench_serving run{'s' if len(ttft) > 1 else ''}: median TTFT error {pct(ttft[0], True)}"
                         + (f" ({len(ttft)} runs)" if len(ttft) > 1 else ""))
        elif ttft:
            parts.append(f"bench_serving runs: median TTFT error {pct(min(ttft), True)} to {pct(max(ttft), True)} "
                         f"({len(ttft)} runs)")
        else:
            parts.append("bench_serving runs: no median TTFT to compare")
    text = "; ".join(parts) or "nothing to compare"
    return (text if text.startswith("poolsim") else text[0].upper() + text[1:]) + "."


def facts(result: dict) -> list[Markup]:
    out = []
    if result.get("steps"):
        e = result["step_time_error_pct"]
        out.append(Markup("Step time: {} {}, {} {} (above 0: poolsim slower); coefficients: {}.").format(
            _m("step_time_error_pct.p90_abs", "p90 |error|"), pct(e["p90_abs"]),
            _m("step_time_error_pct.median_signed", "median signed"), pct(e["median_signed"], True),
            result["coefficients"]))
        kinds = [f"{k} {pct(s['median_abs'])} ({s['steps']:,} steps)" for k, s in result["by_kind"].items()
                 if s["steps"]]
        out.append(Markup("{}: {}.").format(_m("by_kind", "Median |error| by kind"), ", ".join(kinds)))
    if result.get("skipped"):
        n = sum(result["skipped"].values())
        out.append(Markup("{} {:,} records or steps: {}.").format(
            _m("skipped", "Skipped"), n, "; ".join(f"{c:,} x {why}" for why, c in result["skipped"].items())))
    g = result.get("cuda_graph")
    if g and g["disagree"]:
        out.append(Markup("{}: {:,} of {:,} log lines disagree with poolsim's (first at {}).").format(
            _m("cuda_graph.disagree", "cuda graph"), g["disagree"], g["lines"], g["first_disagreement"]))
    for s in result.get("sizes", []):
        diff = [k for k, v in s.items() if isinstance(v, dict) and v["log"] != v["poolsim"]]
        out.append(Markup("{} at {}:{}: {}.").format(
            _m("sizes", "Startup sizes"), s["file"], s["line"],
            "equal to poolsim's plan" if not diff else "differ from poolsim's plan in " + ", ".join(diff)))
    runs = replayed(result)
    for r in runs[:MAX_RUN_FACTS]:
        shown = [(label, (r["metrics"].get(n) or {}).get("error_pct")) for n, label in RUN_FIGURE_METRICS
                 if n in ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2e_latency_ms")]
        out.append(Markup("{}: {}.").format(run_label(r), ", ".join(f"{lab} {pct(v, True)}" for lab, v in shown)))
    if len(runs) > MAX_RUN_FACTS:
        out.append(Markup("{:,} more runs in the tables.").format(len(runs) - MAX_RUN_FACTS))
    skipped_runs = [r for r in result.get("runs", []) if "not_replayed" in r]
    for r in skipped_runs:
        out.append(Markup("{}:{}: not replayed: {}.").format(r["file"], r["line"], r["not_replayed"]))
    return out


def step_rows(result: dict) -> list[dict]:
    if "steps" not in result:
        return []
    rows = [("all", {"steps": result["steps"], **result["step_time_error_pct"]}), *result["by_kind"].items()]
    return [{"kind": k, "steps": units.count(s["steps"]), "median_abs": pct(s["median_abs"]),
             "p90_abs": pct(s["p90_abs"]), "median_signed": pct(s["median_signed"], True)} for k, s in rows]


def _bench_name(name: str) -> Markup:
    key = f"bench.{name}"
    return tables.metric_link(key, name) if key in definitions.index() else Markup.escape(name)


def _bench_value(name: str, value) -> str:
    key = f"bench.{name}"
    if value is None:
        return units.DASH
    return tables.fmt(key, value) if key in definitions.index() else units.by_unit(value, "")


def run_blocks(result: dict) -> list[dict]:
    blocks = []
    for r in result.get("runs", []):
        w = r["workload"]
        workload = [(k.replace("_", " "), units.DASH if v is None else str(v)) for k, v in w.items()
                    if not (k in ("seed", "num_prompts") and k in r)]  # those two: below, with where they came from
        assumed = [f"seed {r['seed']} ({r['seed_from']})"] if "seed" in r else []
        if "num_prompts" in r:
            assumed.append(f"{r['num_prompts']} prompts (from {r['num_prompts_from']})")
        assumed += [f"{k.replace('_', ' ')}: {r[k]}" for k in ("warmup_requests", "lengths", "prompts") if k in r]
        block = {"title": f"{r['file']}:{r['line']}", "label": run_label(r), "workload": workload,
                 "assumed": assumed, "not_replayed": r.get("not_replayed"), "metrics": None, "check": None,
                 "not_in_result": None, "per_request": None}
        if "metrics" in r:
            block["metrics"] = [{"link": _bench_name(n), "measured": _bench_value(n, m["measured"]),
                                 "poolsim": _bench_value(n, m["poolsim"]), "error": pct(m["error_pct"], True)}
                                for n, m in r["metrics"].items()]
            block["check"] = [{"link": _bench_name(n), "measured": units.count(v["measured"]),
                               "poolsim": units.count(v["poolsim"]),
                               "differs": v["measured"] is not None and v["poolsim"] is not None
                               and v["measured"] != v["poolsim"]} for n, v in r["workload_check"].items()]
            block["not_in_result"] = r["not_in_result"]
        if "per_request" in r:
            p = r["per_request"]["ttft_error_pct"]
            block["per_request"] = {"requests": units.count(r["per_request"]["requests"]),
                                    "median_abs": pct(p["median_abs"]), "p90_abs": pct(p["p90_abs"]),
                                    "median_signed": pct(p["median_signed"], True)}
        blocks.append(block)
    return blocks


def files_read(result: dict) -> list[dict]:
    rows = [{"path": f["path"], "format": f["format"], "read": f"{f['steps']:,} steps",
             "usable": f"{f['usable']:,}", "skipped": f"{sum(f.get('skipped', {}).values()):,}",
             "why": "; ".join(f"{n:,} x {why}" for why, n in f.get("skipped", {}).items())}
            for f in result.get("files", [])]
    by_file: dict[str, list[dict]] = {}
    for r in result.get("runs", []):
        by_file.setdefault(r["file"], []).append(r)
    for path, runs in by_file.items():
        n_ok = sum("metrics" in r for r in runs)
        rows.append({"path": path, "format": "bench-serving", "read": f"{len(runs):,} runs", "usable": f"{n_ok:,}",
                     "skipped": f"{len(runs) - n_ok:,}",
                     "why": "; ".join(sorted({r["not_replayed"] for r in runs if "not_replayed" in r}))})
    return rows


def render_validation(result: dict, table: pd.DataFrame | None, pairs: list[dict | None], config: dict) -> str:
    """The page. ``config``: ``model``, ``gpu``, ``step_time_model`` (the coefficients' source), ``server_args``
    and ``memory_plan`` (dicts), as run.json names them."""
    has_steps, has_runs = "steps" in result, bool(result.get("runs"))
    figures_steps = step_figures(result, table) if has_steps else []
    figures_runs = run_figures(result, pairs) if has_runs else []
    step_note = ("No step sources: no forward-pass metrics or server log among the files." if not has_steps else
                 None if figures_steps else "The step sources hold no usable step.")
    run_note = ("No bench_serving runs among the files." if not has_runs else
                None if figures_runs else "No bench_serving run could be replayed (reasons in the tables).")
    namespaces = ("validation", "run") + (("bench",) if has_runs else ())
    title = " on ".join(str(x) for x in (config.get("model"), config.get("gpu")) if x)
    return _env().get_template("validation.html.j2").render(
        title=title or "validation", verdict=verdict(result), facts=facts(result),
        figures_steps=figures_steps, figures_runs=figures_runs, step_note=step_note, run_note=run_note,
        steps=step_rows(result), skipped=[{"why": why, "n": units.count(n), "first": result["first_skipped_at"][why]}
                                          for why, n in result.get("skipped", {}).items()],
        cuda_graph=result.get("cuda_graph"), sizes=result.get("sizes", []), runs=run_blocks(result),
        config=tables.configuration(config), files=files_read(result),
        definitions=tables.definitions_for_page(namespaces))
