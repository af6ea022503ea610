"""One function per figure: DataFrames in, a matplotlib ``Figure`` out (no pyplot state; PNGs are drawn by Agg).

Long runs are drawn in at most ``MAX_BINS`` time bins (``figures.time_bin`` in METRICS.md): a pool panel shows,
per bin and replica, the step with the most memory in use, and sums the replicas, so peaks survive binning.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

from poolsim.reports import units
from poolsim.sim.metrics import percentiles

MAX_BINS = 600  # time bins per timeline
MAX_POINTS = 20_000  # scatter points per series
WIDTH_IN = 10.0  # figure width (inches)

COLORS = {
    "own": "#3b75af", "protected": "#8c6bb1", "evictable": "#74c476", "free": "#e6e6e6",
    "retraction": "#d62728", "abort": "#111111", "running": "#3b75af", "waiting": "#ff7f0e",
    "hybrid": "#3b75af", "full": "#d62728", "host": "#fd8d3c",
}
PCT_STYLE = {"p50": ("#2ca02c", "-"), "p90": ("#ff7f0e", "--"), "p99": ("#d62728", ":")}
TOKENS_FMT = FuncFormatter(lambda v, _: units.tokens(v))
# context lengths are powers of two: 1024 reads as 1k, 131072 as 128k
CONTEXT_FMT = FuncFormatter(lambda v, _: f"{v / 1024:g}k" if v >= 1024 else f"{v:g}")


def _integer_ticks(ax) -> None:
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _figure(height: float, width: float = WIDTH_IN) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _legend_right(ax, **kw) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=9, **kw)


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


# ---------------------------------------------------------------- binning
def time_edges(steps: pd.DataFrame, max_bins: int = MAX_BINS, steps_per_bin: int = 1) -> np.ndarray:
    """Bin edges (s) from the first step's start to the last step's end: at most ``max_bins`` bins, and about
    ``steps_per_bin`` steps or more in each (rates need a few steps per bin to be readable)."""
    if steps.empty:
        return np.array([0.0, 1.0])
    start = float(steps["time_s"].min())
    end = float((steps["time_s"] + steps["duration_s"]).max())
    n = int(min(max_bins, max(len(steps) // steps_per_bin, 1)))
    return np.linspace(start, max(end, start + 1e-9), n + 1)


def _bin_of(times, edges: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(edges, np.asarray(times, dtype=float), side="right") - 1, 0, len(edges) - 2)


def peak_per_bin(steps: pd.DataFrame, edges: np.ndarray, key: str, cols: list[str], before_first: dict,
                 lowest: bool = False) -> pd.DataFrame:
    """Per replica and bin, ``cols`` of the step where ``key`` peaks (or is lowest); a bin without steps keeps
    the state after the replica's last step before it (``before_first`` before its first step); replicas
    summed. One row per bin."""
    n = len(edges) - 1
    df = steps[["replica", *dict.fromkeys([key, *cols])]].assign(_bin=_bin_of(steps["time_s"], edges))
    grouped = df.groupby(["replica", "_bin"])
    chosen = df.loc[grouped[key].idxmin() if lowest else grouped[key].idxmax()]
    last = grouped.tail(1)
    total = pd.DataFrame(0.0, index=range(n), columns=cols)
    for replica, rows in chosen.groupby("replica"):
        peak = rows.set_index("_bin")[cols].reindex(range(n))
        carried = last[last["replica"] == replica].set_index("_bin")[cols].reindex(range(n)).ffill()
        total += peak.combine_first(carried).fillna(before_first).astype(float)
    return total


def sum_per_bin(steps: pd.DataFrame, edges: np.ndarray, col: str) -> np.ndarray:
    return np.bincount(_bin_of(steps["time_s"], edges), weights=steps[col].to_numpy(float), minlength=len(edges) - 1)


def _stairs(edges: np.ndarray, values) -> tuple[np.ndarray, np.ndarray]:
    """x and y for ``step="post"`` drawing that covers the last bin too."""
    v = np.asarray(values, dtype=float)
    return edges, np.append(v, v[-1])


def _event_bins(times, edges: np.ndarray) -> np.ndarray:
    """One x per time bin that holds at least one event (its first event's time)."""
    times = np.sort(np.asarray(times, dtype=float))
    if times.size == 0:
        return times
    _, first = np.unique(_bin_of(times, edges), return_index=True)
    return times[first]


def num_replicas(steps: pd.DataFrame, requests: pd.DataFrame | None = None) -> int:
    ids = [steps["replica"].max() if len(steps) else 0]
    if requests is not None and len(requests):
        ids.append(requests["replica"].max())
    return int(max(ids)) + 1


# ---------------------------------------------------------------- single run
def _swa_panel(ax, steps: pd.DataFrame, edges, capacity: int, reps: int, per_rep: str) -> None:
    """The SWA pool of a hybrid-SWA model, stacked like the KV panel."""
    cap = capacity * reps
    swa = peak_per_bin(steps.assign(_held=-(steps["swa_available_size"] + steps["swa_evictable_size"])), edges,
                       "_held", ["swa_available_size", "swa_evictable_size", "swa_protected_size"],
                       {"swa_available_size": capacity, "swa_evictable_size": 0, "swa_protected_size": 0})
    own = cap - swa["swa_available_size"] - swa["swa_evictable_size"] - swa["swa_protected_size"]
    _stack(ax, edges, [("running requests' own SWA KV", own, "own"),
                       ("protected radix prefix", swa["swa_protected_size"], "protected"),
                       ("evictable radix cache", swa["swa_evictable_size"], "evictable"),
                       ("free", swa["swa_available_size"], "free")])
    ax.set_ylim(0, cap * 1.04)
    ax.set_ylabel("SWA slots (tokens)")
    ax.yaxis.set_major_formatter(TOKENS_FMT)
    ax.set_title(f"SWA KV pool (sliding-window layers): {units.tokens(cap)} slots{per_rep}", loc="left", fontsize=10)


def plot_memory_timeline(steps: pd.DataFrame, requests: pd.DataFrame, pools: dict,
                         cell_size_bytes: int | None = None) -> Figure:
    """Each pool as a stacked area over time (KV: running requests' own, protected prefix, evictable cache, free;
    request rows; mamba state slots for hybrids), with retraction and abort markers.

    ``pools``: ``summary["pools"]`` (per-replica capacities). ``cell_size_bytes`` puts the KV pool's bytes in the title.
    """
    reps = num_replicas(steps, requests)
    has_mamba = "mamba" in pools
    has_swa = "swa" in pools  # hybrid SWA: the KV panel is the full pool, the SWA pool gets its own
    heights = [3.0, 1.6] + ([1.8] if has_mamba else []) + ([3.0] if has_swa else [])
    fig = _figure(sum(heights) + 0.9)
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights})
    edges = time_edges(steps)
    retract_t = _event_bins(steps.loc[steps["retracted"] > 0, "time_s"], edges)
    abort_t = _event_bins(requests.loc[requests["aborted"].astype(bool), "finish_s"].dropna(), edges)
    n_retract = int(steps["retracted"].sum())
    n_abort = int(requests["aborted"].astype(bool).sum())
    per_rep = "" if reps == 1 else f", {reps} replicas summed"

    cap = pools["kv"]["capacity"] * reps
    kv = peak_per_bin(steps.assign(_held=-(steps["available_size"] + steps["evictable_size"])), edges, "_held",
                      ["available_size", "evictable_size", "protected_size"],
                      {"available_size": pools["kv"]["capacity"], "evictable_size": 0, "protected_size": 0})
    own = cap - kv["available_size"] - kv["evictable_size"] - kv["protected_size"]
    layers = [("running requests' own KV", own, "own"), ("protected radix prefix", kv["protected_size"], "protected"),
              ("evictable radix cache", kv["evictable_size"], "evictable"), ("free", kv["available_size"], "free")]
    _stack(axes[0], edges, layers)
    axes[0].set_ylim(0, cap * 1.04)
    axes[0].set_ylabel("KV slots (tokens)")
    axes[0].yaxis.set_major_formatter(TOKENS_FMT)
    size = f" = {units.nbytes(pools['kv']['capacity'] * cell_size_bytes)} per tp rank" if cell_size_bytes else ""
    which = "Full KV pool (full-attention layers)" if has_swa else "KV pool"
    size = "" if has_swa else size  # the cell size counts both pools' layers
    axes[0].set_title(f"{which}: {units.tokens(cap)} slots{size}{per_rep}", loc="left", fontsize=10)

    rows_cap = pools["rows"]["capacity"] * reps
    rows = peak_per_bin(steps, edges, "free_req_rows", ["free_req_rows"], {"free_req_rows": pools["rows"]["capacity"]},
                        lowest=True)
    _stack(axes[1], edges, [("rows in use", rows_cap - rows["free_req_rows"], "own"),
                            ("free rows", rows["free_req_rows"], "free")])
    axes[1].set_ylim(0, rows_cap * 1.04)
    axes[1].set_ylabel("request rows")
    _integer_ticks(axes[1])
    axes[1].set_title(f"Request rows (req_to_token): {units.count(rows_cap)}{per_rep}", loc="left", fontsize=10)

    if has_mamba:
        mcap = pools["mamba"]["capacity"] * reps
        m = peak_per_bin(steps, edges, "mamba_free_slots", ["mamba_free_slots", "mamba_evictable_states"],
                         {"mamba_free_slots": pools["mamba"]["capacity"], "mamba_evictable_states": 0}, lowest=True)
        _stack(axes[2], edges, [("running requests' states", mcap - m["mamba_free_slots"] - m["mamba_evictable_states"],
                                 "own"),
                                ("evictable states in the radix tree", m["mamba_evictable_states"], "evictable"),
                                ("free slots", m["mamba_free_slots"], "free")])
        axes[2].set_ylim(0, mcap * 1.04)
        axes[2].set_ylabel("state slots")
        _integer_ticks(axes[2])
        axes[2].set_title(f"Mamba state pool: {units.count(mcap)} slots{per_rep}", loc="left", fontsize=10)

    if has_swa:
        _swa_panel(axes[-1], steps, edges, pools["swa"]["capacity"], reps, per_rep)

    for i, ax in enumerate(axes):
        if len(retract_t):
            ax.vlines(retract_t, 0, 1, transform=ax.get_xaxis_transform(), colors=COLORS["retraction"], lw=0.8,
                      alpha=0.7, label=f"retraction ({units.count(n_retract)})" if i == 0 else None)
        if len(abort_t):
            ax.vlines(abort_t, 0, 1, transform=ax.get_xaxis_transform(), colors=COLORS["abort"], lw=0.8,
                      linestyles="--", label=f"abort ({units.count(n_abort)})" if i == 0 else None)
        ax.margins(x=0)
        _legend_right(ax)
    axes[-1].set_xlabel("time (s)")
    return fig


def _stack(ax, edges: np.ndarray, layers) -> None:
    bottom = np.zeros(len(edges))
    for label, values, color in layers:
        x, y = _stairs(edges, values)
        ax.fill_between(x, bottom, bottom + y, step="post", color=COLORS[color], label=label, lw=0)
        bottom = bottom + y


def plot_queue(steps: pd.DataFrame, rows_capacity: int | None = None) -> Figure:
    """Running and waiting requests over time (each time bin's peak, replicas summed), each on its own axis: a
    queue of 250k waiting requests would flatten ~200 running ones on a shared one."""
    fig = _figure(4.6)
    run_ax, wait_ax = fig.subplots(2, 1, sharex=True)
    edges = time_edges(steps)
    q = pd.DataFrame({c: peak_per_bin(steps, edges, c, [c], {c: 0})[c] for c in ("running", "waiting")})
    for ax, col, label in ((run_ax, "running", "running (holding a request row)"),
                           (wait_ax, "waiting", "waiting in the queue")):
        x, y = _stairs(edges, q[col])
        ax.step(x, y, where="post", color=COLORS[col], label=label, lw=1.4)
        ax.set_ylabel(f"{col} requests")
        ax.set_ylim(bottom=0)
        _integer_ticks(ax)
        ax.margins(x=0)
    if rows_capacity:
        run_ax.axhline(rows_capacity, color="grey", ls="--", lw=1,
                       label=f"request rows ({units.count(rows_capacity)})")
    wait_ax.set_xlabel("time (s)")
    _legend_right(run_ax)
    _legend_right(wait_ax)
    return fig


def plot_prefix_cache(steps: pd.DataFrame, requests: pd.DataFrame) -> Figure:
    """Prefix-cache hit rate over time (per time bin and cumulative) and per request at first admission."""
    fig = _figure(3.6)
    ax_t, ax_r = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    edges = time_edges(steps, max_bins=120, steps_per_bin=8)
    cached = sum_per_bin(steps, edges, "cached_prefill_tokens")
    computed = sum_per_bin(steps, edges, "prefill_tokens")
    total = cached + computed
    if total.sum() > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(total > 0, cached / total, np.nan)
            cumulative = np.cumsum(cached) / np.cumsum(total)
        mid = (edges[:-1] + edges[1:]) / 2
        ax_t.bar(mid, rate, width=np.diff(edges), color=COLORS["evictable"], alpha=0.8, label="per time bin")
        ax_t.plot(edges[1:], cumulative, color="black", lw=1.5, label="cumulative")
        ax_t.set_ylim(0, 1.05)
        ax_t.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax_t.set_xlabel("time (s)")
        ax_t.set_ylabel("prefill tokens from cache (%)")
        ax_t.set_title("Hit rate over time", loc="left", fontsize=10)
        ax_t.legend(fontsize=9, loc="upper left")
        ax_t.margins(x=0)
    else:
        _no_data(ax_t, "no prefill tokens")
    done = requests[~requests["aborted"].astype(bool) & (requests["input_len"] > 0)]
    if len(done):
        frac = (done["cached_tokens_first"] / done["input_len"]).clip(0, 1)
        ax_r.hist(frac, bins=np.linspace(0, 1, 21), color=COLORS["own"], edgecolor="white")
        ax_r.axvline(frac.mean(), color="black", ls="--", lw=1.2, label=f"mean {units.percent(frac.mean())}")
        ax_r.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax_r.set_xlabel("prompt found in cache at first admission (%)")
        ax_r.set_ylabel("requests")
        _integer_ticks(ax_r)
        ax_r.set_title("Per request", loc="left", fontsize=10)
        ax_r.legend(fontsize=9, loc="upper right")
    else:
        _no_data(ax_r, "no finished requests")
    return fig


def plot_hicache(steps: pd.DataFrame, summary: dict) -> Figure:
    """HiCache: where the cached prompt tokens came from over time (matched on the GPU, loaded back from host) and
    the host pool's occupancy with its traffic (tokens written to and loaded from host per time bin)."""
    fig = _figure(5.4)
    ax_hit, ax_host = fig.subplots(2, 1, sharex=True)
    edges = time_edges(steps, max_bins=120, steps_per_bin=8)
    host = sum_per_bin(steps, edges, "host_loaded_tokens")
    device = sum_per_bin(steps, edges, "cached_prefill_tokens") - host
    total = device + host + sum_per_bin(steps, edges, "prefill_tokens")
    if total.sum() > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            dev_rate, host_rate = np.where(total > 0, device / total, 0.0), np.where(total > 0, host / total, 0.0)
        _stack(ax_hit, edges, [("matched on the GPU (device tier)", dev_rate, "evictable"),
                               ("loaded back from host (host tier)", host_rate, "host")])
        ax_hit.set_ylim(0, 1.05)
        ax_hit.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax_hit.set_ylabel("prefill tokens from cache")
        ax_hit.set_title("Cache hits per tier", loc="left", fontsize=10)
        ax_hit.margins(x=0)
        _legend_right(ax_hit)
    else:
        _no_data(ax_hit, "no prefill tokens")
    cap = summary["hicache"]["host_capacity_tokens"] * num_replicas(steps)
    used = peak_per_bin(steps, edges, "host_used_size", ["host_used_size"], {"host_used_size": 0})["host_used_size"]
    x, y = _stairs(edges, used)
    ax_host.fill_between(x, 0, y, step="post", color=COLORS["host"], alpha=0.5, lw=0, label="host slots held (peak)")
    ax_host.axhline(cap, color="grey", ls="--", lw=1, label=f"host pool ({units.tokens(cap)} tokens)")
    ax_host.set_ylabel("host tokens")
    ax_host.yaxis.set_major_formatter(TOKENS_FMT)
    ax_host.set_ylim(bottom=0)
    traffic = ax_host.twinx()
    for col, label, color in (("host_written_tokens", "written to host per bin", "own"),
                              ("host_loaded_tokens", "loaded from host per bin", "retraction")):
        tx, ty = _stairs(edges, sum_per_bin(steps, edges, col))
        traffic.step(tx, ty, where="post", color=COLORS[color], lw=1.1, label=label)
    traffic.set_ylabel("tokens moved")
    traffic.yaxis.set_major_formatter(TOKENS_FMT)
    traffic.set_ylim(bottom=0)
    ax_host.set_xlabel("time (s)")
    ax_host.set_title("Host pool", loc="left", fontsize=10)
    ax_host.margins(x=0)
    lines, labels = ax_host.get_legend_handles_labels()
    more, more_labels = traffic.get_legend_handles_labels()
    ax_host.legend(lines + more, labels + more_labels, loc="upper left", bbox_to_anchor=(1.12, 1.0),
                   borderaxespad=0.0, fontsize=9)
    return fig


LATENCIES = (("ttft_s", "Time to first token"), ("itl_s", "Inter-token latency (per-request mean)"),
             ("e2e_s", "End-to-end latency"))


def _time_unit(values) -> tuple[float, str]:
    """Scale and unit label for an axis of durations: ms below a second, s otherwise."""
    top = float(np.nanmax(values)) if len(values) else 0.0
    return (1e3, "ms") if top < 1.0 else (1.0, "s")


def plot_latency(requests: pd.DataFrame) -> Figure:
    """Histograms of TTFT, inter-token latency and end-to-end latency of finished requests, p50/p90/p99 marked."""
    fig = _figure(7.2)
    axes = fig.subplots(3, 1)
    done = requests[~requests["aborted"].astype(bool)]
    for ax, (col, title) in zip(axes, LATENCIES):
        s = done[col].dropna().to_numpy(float)
        ax.set_title(title, loc="left", fontsize=10)
        if s.size == 0:
            _no_data(ax, "no finished requests")
            continue
        scale, unit = _time_unit(s)
        v = s * scale
        lo, hi = float(v.min()), float(v.max())
        log = lo > 0 and hi / lo > 50
        bins = np.geomspace(lo, hi, 40) if log else np.linspace(lo, hi if hi > lo else lo + 1, 40)
        ax.hist(v, bins=bins, color=COLORS["free"], edgecolor="#888888", lw=0.5)
        if log:
            ax.set_xscale("log")
        for name, value in percentiles(pd.Series(s)).items():
            color, ls = PCT_STYLE[name]
            ax.axvline(value * scale, color=color, ls=ls, lw=1.6, label=f"{name} {units.seconds(value)}")
        ax.set_xlabel(f"{col} ({unit})")
        ax.set_ylabel("requests")
        _integer_ticks(ax)
        _legend_right(ax)
    return fig


def plot_fragmentation(steps: pd.DataFrame, requests: pd.DataFrame, summary: dict) -> Figure:
    """Memory held but not doing work: partial pages, KV not cached at finish, reserved vs used
    ``req_to_token`` entries, and idle mamba slots (hybrids)."""
    has_mamba = "mamba" in summary["pools"]
    fig = _figure(6.2 if has_mamba else 3.4, width=12.0 if not has_mamba else WIDTH_IN)
    axes = fig.subplots(2, 2).ravel() if has_mamba else fig.subplots(1, 3)
    frag = summary.get("fragmentation", {})
    edges = time_edges(steps, max_bins=200)
    reps = num_replicas(steps, requests)

    ax = axes[0]
    partial = peak_per_bin(steps, edges, "partial_page_tokens", ["partial_page_tokens"], {"partial_page_tokens": 0})
    ax.set_title("Partial pages: allocated, not yet filled", loc="left", fontsize=10)
    if partial["partial_page_tokens"].max() > 0:
        x, y = _stairs(edges, partial["partial_page_tokens"])
        ax.step(x, y, where="post", color=COLORS["own"], lw=1.2, label="peak in each time bin")
        if "mean_partial_page_tokens" in frag:
            ax.axhline(frag["mean_partial_page_tokens"] * reps, color="black", ls="--", lw=1,
                       label=f"time-weighted mean {units.tokens(frag['mean_partial_page_tokens'] * reps)}")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV slots (tokens)")
        ax.set_ylim(0, float(y.max()) * 1.4)  # room for the legend above the line
        ax.yaxis.set_major_formatter(TOKENS_FMT)
        ax.margins(x=0)
        ax.legend(fontsize=9, loc="upper right")
    else:
        _no_data(ax, "no partial pages (page_size 1, or every page full)")

    ax = axes[1]
    done = requests[~requests["aborted"].astype(bool)]
    lost = done["tokens_not_cached"].to_numpy(float)
    ax.set_title(f"KV not cached at finish: {units.tokens(lost.sum())} tokens in all", loc="left", fontsize=10)
    if lost.size and lost.max() > 0:
        bins = np.arange(lost.max() + 2) - 0.5 if lost.max() <= 60 else 30  # one bar per token count when few
        ax.hist(lost, bins=bins, color=COLORS["own"], edgecolor="white")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("tokens per finished request")
        ax.set_ylabel("requests")
        _integer_ticks(ax)
    else:
        _no_data(ax, "every finished request's KV was cached")

    ax = axes[2]
    reserved = frag.get("req_to_token_bytes_reserved")
    if reserved:
        used_frac = steps["row_tokens"] / (reserved / 4)  # int32 entries
        bars = {"reserved": reserved, "peak used": float(used_frac.max()) * reserved if len(steps) else 0.0,
                "mean used": frag.get("req_to_token_mean_used_frac", 0.0) * reserved}
        scale, unit = _byte_unit(reserved)
        ypos = np.arange(len(bars))[::-1]
        ax.barh(ypos, [v / scale for v in bars.values()], color=[COLORS["free"], COLORS["own"], COLORS["protected"]],
                edgecolor="#888888")
        ax.set_yticks(ypos, list(bars))
        for y_, v in zip(ypos, bars.values()):
            ax.text(v / scale, y_, f" {units.nbytes(v)} ({units.percent(v / reserved)})", va="center", fontsize=9)
        ax.set_xlim(0, reserved / scale * 1.6)
        ax.set_xlabel(f"req_to_token table per replica ({unit})")
        ax.set_title("Request-row table: reserved vs used", loc="left", fontsize=10)
    else:
        _no_data(ax, "req_to_token size not in summary.json")

    if has_mamba:
        ax = axes[3]
        idle = peak_per_bin(steps, edges, "mamba_free_slots", ["mamba_free_slots"], {
            "mamba_free_slots": summary["pools"]["mamba"]["capacity"]})
        x, y = _stairs(edges, idle["mamba_free_slots"])
        ax.step(x, y, where="post", color=COLORS["evictable"], lw=1.2, label="fewest in each time bin")
        mean_idle = summary["pools"]["mamba"].get("mean_idle_slots")
        if mean_idle is not None:
            ax.axhline(mean_idle * reps, color="black", ls="--", lw=1,
                       label=f"time-weighted mean {units.sig3(mean_idle * reps)}")
        ax.set_title("Idle mamba state slots", loc="left", fontsize=10)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("free state slots")
        _integer_ticks(ax)
        ax.set_ylim(0, summary["pools"]["mamba"]["capacity"] * reps * 1.05)
        ax.margins(x=0)
        ax.legend(fontsize=9, loc="upper right")
    return fig


def _byte_unit(n: float) -> tuple[float, str]:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return scale, unit
    return 1, "bytes"


def plot_hybrid_compare(compare: dict, model: str = "hybrid") -> Figure:
    """Bytes per request and max concurrency vs context length: the hybrid (linear-attention state plus MLA KV)
    against its full-attention twin (``run.json["hybrid_compare"]``; series missing there are left out)."""
    fig = _figure(4.2)
    ax_b, ax_c = fig.subplots(1, 2)
    lens = np.asarray(compare["context_len"], dtype=float)
    full_name = compare.get("full_attn_model", "full attention")
    cross = compare.get("crossover_context_len") or _crossover(
        lens, compare.get("hybrid_bytes_per_request"), compare.get("full_attn_bytes_per_request"))
    panels = ((ax_b, "bytes_per_request", 1 / 2**30, "memory per request (GiB, one tp rank)", "Bytes per request"),
              (ax_c, "max_concurrency", 1.0, "max concurrent requests", "Max concurrency"))
    for ax, field, scale, ylabel, title in panels:
        ax.set_title(title, loc="left", fontsize=10)
        drawn = []
        for key, label, color in (("hybrid", f"{model} (KDA state + MLA KV)", COLORS["hybrid"]),
                                  ("full_attn", f"{full_name} (MLA KV)", COLORS["full"])):
            if f"{key}_{field}" in compare:
                y = np.asarray(compare[f"{key}_{field}"], float) * scale
                ax.plot(lens[y > 0], y[y > 0], marker="o", ms=3, color=color, label=label)
                drawn.append(y[y > 0])
        values = np.concatenate(drawn) if drawn else np.array([])
        if not values.size:
            _no_data(ax, f"no {field.replace('_', ' ')} in run.json")
            continue
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(CONTEXT_FMT)
        ax.set_xlabel("context length per request (tokens, k = 1024)")
        if values.max() / values.min() > 10:  # a log axis only where it spans decades: its ticks are decades
            ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}") if field == "bytes_per_request"
                                     else TOKENS_FMT)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        if cross is not None:
            exact = "=" if compare.get("crossover_context_len") else "≈"
            ax.axvline(cross, color="grey", ls="--", lw=1, label=f"break-even {exact} {units.tokens(cross)} tokens")
    handles, labels = max((ax.get_legend_handles_labels() for ax in (ax_b, ax_c)), key=lambda hl: len(hl[0]))
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    return fig


def _crossover(lens: np.ndarray, hybrid, full) -> float | None:
    """Context length where the hybrid's bytes per request drop below the full-attention model's (log-interpolated)."""
    if hybrid is None or full is None:
        return None
    d = np.asarray(hybrid, float) - np.asarray(full, float)
    flips = np.nonzero((d[:-1] > 0) & (d[1:] <= 0))[0]
    if not flips.size:
        return None
    i = flips[0]
    frac = d[i] / (d[i] - d[i + 1])
    return float(np.exp2(np.log2(lens[i]) + frac * (np.log2(lens[i + 1]) - np.log2(lens[i]))))


# ---------------------------------------------------------------- comparisons and sweeps
def plot_compare_memory(runs: dict[str, tuple[pd.DataFrame, dict]]) -> Figure:
    """KV and request rows in use (% of capacity) over time, one line per run. ``runs``: label -> (steps, summary)."""
    fig = _figure(5.0)
    ax_kv, ax_rows = fig.subplots(2, 1, sharex=True)
    for label, (steps, summary) in runs.items():
        pools, reps = summary["pools"], num_replicas(steps)
        edges = time_edges(steps)
        kv = peak_per_bin(steps.assign(_held=-(steps["available_size"] + steps["evictable_size"])), edges, "_held",
                          ["_held"], {"_held": -pools["kv"]["capacity"]})
        cap = pools["kv"]["capacity"] * reps
        x, y = _stairs(edges, (cap + kv["_held"]) / cap)
        ax_kv.step(x, y, where="post", lw=1.3, label=label)
        rows = peak_per_bin(steps, edges, "free_req_rows", ["free_req_rows"],
                            {"free_req_rows": pools["rows"]["capacity"]}, lowest=True)
        rcap = pools["rows"]["capacity"] * reps
        x, y = _stairs(edges, (rcap - rows["free_req_rows"]) / rcap)
        ax_rows.step(x, y, where="post", lw=1.3, label=label)
    ax_kv.set_ylabel("KV in use (% of pool)")
    ax_kv.set_title("KV held by requests and locked prefixes (evictable cache not counted)", loc="left", fontsize=10)
    ax_rows.set_ylabel("rows in use (% of rows)")
    ax_rows.set_title("Request rows", loc="left", fontsize=10)
    ax_rows.set_xlabel("time (s)")
    for ax in (ax_kv, ax_rows):
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.margins(x=0)
        _legend_right(ax)
    return fig


def plot_compare_latency(runs: dict[str, pd.DataFrame]) -> Figure:
    """CDFs of TTFT, inter-token and end-to-end latency, one line per run, p99 marked. ``runs``: label -> requests."""
    fig = _figure(3.8, width=12.0)
    axes = fig.subplots(1, 3)
    for ax, (col, title) in zip(axes, LATENCIES):
        series = {label: r.loc[~r["aborted"].astype(bool), col].dropna().to_numpy(float) for label, r in runs.items()}
        present = [s for s in series.values() if s.size]
        ax.set_title(title, loc="left", fontsize=10)
        if not present:
            _no_data(ax, "no finished requests")
            continue
        every = np.concatenate(present)
        scale, unit = _time_unit(every)
        if every.min() > 0 and every.max() / every.min() > 50:
            ax.set_xscale("log")
        for i, (label, s) in enumerate(series.items()):
            if not s.size:
                continue
            v = np.sort(s) * scale
            color = f"C{i}"
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=color, lw=1.4, label=label)
            p99 = percentiles(pd.Series(s))["p99"]
            ax.plot([p99 * scale], [0.99], marker="o", color=color, ms=5)
        ax.axhline(0.99, color="grey", ls=":", lw=1)
        ax.set_xlabel(f"{col} ({unit})")
        ax.set_ylabel("share of finished requests")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8, loc="lower right", title="dot: p99", title_fontsize=8)
    return fig


def plot_compare_throughput(runs: dict[str, pd.DataFrame]) -> Figure:
    """Prefill and decode tokens per second over time, one line per run. ``runs``: label -> steps."""
    fig = _figure(5.0)
    ax_p, ax_d = fig.subplots(2, 1, sharex=True)
    for label, steps in runs.items():
        edges = time_edges(steps, max_bins=150, steps_per_bin=8)
        width = np.diff(edges)
        for ax, col in ((ax_p, "prefill_tokens"), (ax_d, "decode_tokens")):
            x, y = _stairs(edges, sum_per_bin(steps, edges, col) / width)
            ax.step(x, y, where="post", lw=1.3, label=label)
    ax_p.set_ylabel("prefill (tok/s)")
    ax_p.set_title("Prompt tokens computed per second", loc="left", fontsize=10)
    ax_d.set_ylabel("decode (tok/s)")
    ax_d.set_title("Output tokens decoded per second", loc="left", fontsize=10)
    ax_d.set_xlabel("time (s)")
    for ax in (ax_p, ax_d):
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(TOKENS_FMT)
        ax.margins(x=0)
        _legend_right(ax)
    return fig


def pareto_frontier(sweep: pd.DataFrame) -> pd.Series:
    """True for the rows no other row beats on both throughput (higher) and p99 latency (lower)."""
    order = sweep.sort_values(["p99_latency_s", "throughput_tok_s"], ascending=[True, False])
    best, keep = -np.inf, []
    for idx, tput in order["throughput_tok_s"].items():
        if tput > best:
            keep.append(idx)
            best = tput
    return sweep.index.isin(keep)


def plot_frontier(sweep: pd.DataFrame, slo_s: float | None = None, cost_unit: str = "$/hour") -> Figure:
    """A sweep: throughput vs p99 latency, the Pareto frontier joined, optional cost as colour and a second panel
    of throughput per unit cost. Columns: ``label, throughput_tok_s, p99_latency_s[, cost]``."""
    has_cost = "cost" in sweep.columns
    fig = _figure(4.2, width=12.0 if has_cost else WIDTH_IN)
    axes = fig.subplots(1, 2 if has_cost else 1)
    ax = axes[0] if has_cost else axes
    on = pareto_frontier(sweep)
    front = sweep[on].sort_values("p99_latency_s")
    if has_cost:
        pts = ax.scatter(sweep["p99_latency_s"], sweep["throughput_tok_s"], c=sweep["cost"], cmap="viridis", s=36,
                         zorder=3)
        fig.colorbar(pts, ax=ax, label=f"cost ({cost_unit})")
    else:
        ax.scatter(sweep["p99_latency_s"], sweep["throughput_tok_s"], color=COLORS["own"], s=36, zorder=3)
    if len(front) >= 2:  # one point draws no line, so the legend must not name one
        ax.plot(front["p99_latency_s"], front["throughput_tok_s"], color="black", lw=1.2, drawstyle="steps-post",
                label="frontier", zorder=2)
    labelled = sweep if len(sweep) <= 20 else front
    for _, row in labelled.iterrows():
        ax.annotate(str(row["label"]), (row["p99_latency_s"], row["throughput_tok_s"]), xytext=(4, 4),
                    textcoords="offset points", fontsize=8)
    if slo_s is not None:
        ax.axvline(slo_s, color=COLORS["retraction"], ls="--", lw=1, label=f"p99 SLO {units.seconds(slo_s)}")
    ax.set_xlabel("p99 latency (s)")
    ax.set_ylabel("throughput (tok/s)")
    tput = sweep["throughput_tok_s"]
    if tput.max() - tput.min() > 0.1 * tput.abs().max():  # compact 12.3k ticks only where 3 digits tell them apart
        ax.yaxis.set_major_formatter(TOKENS_FMT)
    else:
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.grid(True, alpha=0.3)
    ax.margins(0.12)
    latency = sweep["p99_latency_s"] if slo_s is None else pd.concat([sweep["p99_latency_s"], pd.Series([slo_s])])
    _from_zero_if_close(ax, latency, sweep["throughput_tok_s"])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, loc="best")
    if has_cost:
        ax2 = axes[1]
        per_cost = sweep["throughput_tok_s"] / sweep["cost"]
        ax2.scatter(sweep["p99_latency_s"], per_cost, color=COLORS["own"], s=36, zorder=3)
        for (_, row), v in zip(labelled.iterrows(), per_cost[labelled.index]):
            ax2.annotate(str(row["label"]), (row["p99_latency_s"], v), xytext=(4, 4), textcoords="offset points",
                         fontsize=8)
        ax2.set_xlabel("p99 latency (s)")
        ax2.set_ylabel(f"throughput per cost (tok/s per {cost_unit})")
        ax2.margins(0.12)
        ax2.yaxis.set_major_formatter(TOKENS_FMT)
        ax2.grid(True, alpha=0.3)
        if slo_s is not None:
            ax2.axvline(slo_s, color=COLORS["retraction"], ls="--", lw=1)
    return fig


def _from_zero_if_close(ax, xs: pd.Series, ys: pd.Series, spread: float = 0.1) -> None:
    """An axis whose values lie within ``spread`` of each other starts at zero: autoscaled to 142.1-142.9 tok/s, a
    0.5 % difference would read as a wide spread."""
    for values, setter in ((xs, ax.set_xlim), (ys, ax.set_ylim)):
        v = pd.to_numeric(values, errors="coerce").dropna()
        if len(v) and v.min() >= 0 and v.max() > 0 and v.max() - v.min() < spread * v.max():
            setter(0, v.max() * 1.15)


def plot_capacity(points: list[dict], slo_p99_s: float, slo_on: str, capacity_scale: float | None) -> Figure:
    """``poolsim capacity``: p99 latency (the SLO's metric) and sustained throughput against the load scale, each
    point a whole simulation; holding points filled, failing ones hollow; the SLO and the capacity marked."""
    fig = _figure(5.0)
    lat, thr = fig.subplots(2, 1, sharex=True)
    pts = sorted(points, key=lambda p: p["scale"])
    xs = np.array([p["scale"] for p in pts], dtype=float)
    held = np.array([p["holds"] for p in pts], dtype=bool)
    p99 = np.array([np.nan if p["p99_s"] is None else p["p99_s"] for p in pts], dtype=float)
    tok = np.array([p["output_tok_s"] for p in pts], dtype=float)
    for ax, ys, label in ((lat, p99, f"p99 {slo_on} latency (s)"), (thr, tok, "output tokens/s")):
        ax.plot(xs, ys, color=COLORS["running"], lw=1)
        ax.scatter(xs[held], ys[held], color=COLORS["running"], zorder=3, label="holds")
        ax.scatter(xs[~held], ys[~held], facecolors="white", edgecolors=COLORS["retraction"], zorder=3,
                   label="does not hold")
        ax.set_ylabel(label)
        if capacity_scale is not None:
            ax.axvline(capacity_scale, color="#555555", ls="--", lw=1)
    lat.axhline(slo_p99_s, color=COLORS["retraction"], ls=":", lw=1, label=f"SLO {units.seconds(slo_p99_s)}")
    lat.set_ylim(bottom=0)
    thr.set_ylim(bottom=0)  # from zero: a flat plateau reads as flat, not as spread
    thr.set_xscale("log", base=2)
    thr.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    thr.set_xlabel("arrival rate scale (the trace's gaps divided by x)")
    title = "capacity: " + (f"{capacity_scale:.3g}x the trace's rate" if capacity_scale is not None
                            else "no load tried holds")
    lat.set_title(title)
    _legend_right(lat)
    return fig
