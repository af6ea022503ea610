"""The figures: exact binning and frontier arithmetic on hand-made frames, and every figure labelled, unclipped
and quick on real simulated runs and on a 100k-step frame."""

import time

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection

from poolsim.app.output import read_run
from poolsim.reports import plots
from tests.reports.synthetic import CAPACITY, big_run


def frame(rows):
    return pd.DataFrame(rows, columns=["replica", "time_s", "available_size"])


def test_peak_per_bin_takes_the_busiest_step_fills_gaps_and_sums_replicas():
    steps = frame([(0, 0.1, 5), (0, 0.5, 2), (0, 2.2, 7), (1, 1.5, 1), (1, 1.7, 3)])
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    got = plots.peak_per_bin(steps, edges, "available_size", ["available_size"], {"available_size": 10},
                             lowest=True)
    # bin 0: replica 0's lowest 2 + replica 1 before its first step 10; bin 1: replica 0 has no step, so the
    # state after its last one (2) + replica 1's lowest 1; bin 2: 7 + the state after replica 1's last step (3)
    assert got["available_size"].tolist() == [2 + 10, 2 + 1, 7 + 3]
    highest = plots.peak_per_bin(steps, edges, "available_size", ["available_size"], {"available_size": 0})
    assert highest["available_size"].tolist() == [5 + 0, 2 + 3, 7 + 3]


def test_sum_per_bin_and_event_bins():
    steps = pd.DataFrame({"time_s": [0.1, 0.2, 1.5, 2.9], "prefill_tokens": [10, 20, 30, 40]})
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    assert plots.sum_per_bin(steps, edges, "prefill_tokens").tolist() == [30.0, 30.0, 40.0]
    assert plots.time_edges(pd.DataFrame({"time_s": [0.0, 1.0], "duration_s": [0.5, 1.0]})).tolist() == [0, 1, 2]
    # one marker per bin that holds events: the first event's time
    assert plots._event_bins([0.7, 0.2, 2.5, 2.6], edges).tolist() == [0.2, 2.5]


def test_pareto_frontier():
    sweep = pd.DataFrame({"label": list("abcde"), "throughput_tok_s": [100, 300, 200, 300, 50],
                          "p99_latency_s": [1.0, 2.0, 1.5, 3.0, 0.5]})
    # d: fastest; a beats nothing faster; c: more throughput than a at more latency; b: most throughput
    # e is fastest; e (dominated by nothing) kept; "d" (300 at 3.0) is beaten by b (300 at 2.0)
    assert sweep.loc[plots.pareto_frontier(sweep), "label"].tolist() == ["a", "b", "c", "e"]


def test_crossover_is_log_interpolated():
    lens = np.array([1024.0, 2048.0, 4096.0])
    assert plots._crossover(lens, [300, 200, 300], [100, 400, 800]) == pytest.approx(1024 * 2 ** 0.5)
    assert plots._crossover(lens, [50, 60, 70], [100, 400, 800]) is None  # the hybrid is never bigger
    assert plots._crossover(lens, None, [1, 2, 3]) is None


def drawn(fig):
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def assert_readable(fig, name):
    """Every axis that shows numbers is labelled, and nothing drawn sticks out of the figure."""
    renderer = drawn(fig)
    w, h = fig.get_size_inches()
    box = fig.get_tightbbox(renderer)
    assert box.x0 >= -0.01 and box.y0 >= -0.01 and box.x1 <= w + 0.01 and box.y1 <= h + 0.01, (name, box, (w, h))
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            assert ax.get_ylabel(), name
            continue
        if numbered(ax.get_xticklabels()):
            assert ax.get_xlabel(), (name, ax.get_title(loc="left"))
        if numbered(ax.get_yticklabels()):
            assert ax.get_ylabel(), (name, ax.get_title(loc="left"))


def numbered(ticklabels):
    """The axis shows numbers (not hidden by a shared axis, not category names), so it needs a label with units."""
    return any(t.get_visible() and any(ch.isdigit() for ch in t.get_text()) for t in ticklabels)


@pytest.mark.parametrize("scenario", ["fits", "retracts", "aborts", "hybrid"])
def test_every_figure_of_a_real_run_is_labelled_and_unclipped(run_dirs, scenario):
    steps, requests, summary, run = read_run(run_dirs[scenario])
    figs = {
        "memory": plots.plot_memory_timeline(steps, requests, summary["pools"], 1152),
        "queue": plots.plot_queue(steps, summary["pools"]["rows"]["capacity"]),
        "cache": plots.plot_prefix_cache(steps, requests),
        "latency": plots.plot_latency(requests),
        "fragmentation": plots.plot_fragmentation(steps, requests, summary),
    }
    if "hybrid_compare" in run:
        figs["hybrid"] = plots.plot_hybrid_compare(run["hybrid_compare"], run["model"])
    for name, fig in figs.items():
        assert_readable(fig, f"{scenario}/{name}")
    assert len(figs["memory"].axes) == (3 if scenario == "hybrid" else 2)


def test_memory_stack_adds_up_to_capacity_and_marks_retractions(run_dirs):
    steps, requests, summary, _ = read_run(run_dirs["retracts"])
    fig = plots.plot_memory_timeline(steps, requests, summary["pools"])
    kv = fig.axes[0]
    layers = {c.get_label(): c for c in kv.collections if isinstance(c, PolyCollection)}
    assert list(layers) == ["running requests' own KV", "protected radix prefix", "evictable radix cache", "free"]
    tops = layers["free"].get_paths()[0].vertices[:, 1]
    assert tops.max() == pytest.approx(summary["pools"]["kv"]["capacity"])
    assert min(p.vertices[:, 1].min() for c in layers.values() for p in c.get_paths()) >= 0
    marks = [c for c in kv.collections if c.get_label().startswith("retraction")]
    assert marks[0].get_label() == f"retraction ({summary['retractions']})"
    edges = plots.time_edges(steps)
    bins_with_retraction = len(set(plots._bin_of(steps.loc[steps["retracted"] > 0, "time_s"], edges)))
    assert len(marks[0].get_segments()) == bins_with_retraction


def test_latency_lines_are_the_summary_percentiles(run_dirs):
    _, requests, summary, _ = read_run(run_dirs["retracts"])
    fig = plots.plot_latency(requests)
    for ax, key in zip(fig.axes, ("ttft_s", "itl_s", "e2e_s")):
        scale = 1e3 if "(ms)" in ax.get_xlabel() else 1.0
        lines = {ln.get_label().split()[0]: ln.get_xdata()[0] for ln in ax.get_lines()}
        for p in ("p50", "p90", "p99"):
            assert lines[p] == pytest.approx(summary[key][p] * scale, rel=1e-12)


def test_no_finished_request_draws_an_explanation():
    requests = pd.DataFrame({"aborted": [True], "ttft_s": [np.nan], "itl_s": [np.nan], "e2e_s": [0.5]})
    fig = plots.plot_latency(requests)
    assert [t.get_text() for ax in fig.axes for t in ax.texts] == ["no finished requests"] * 3


def test_comparison_and_frontier_figures(run_dirs):
    runs = {name: read_run(run_dirs[name]) for name in ("fits", "retracts")}
    figs = {
        "memory": plots.plot_compare_memory({k: (v[0], v[2]) for k, v in runs.items()}),
        "latency": plots.plot_compare_latency({k: v[1] for k, v in runs.items()}),
        "throughput": plots.plot_compare_throughput({k: v[0] for k, v in runs.items()}),
    }
    sweep = pd.DataFrame({"label": [f"tp{t} mf{m}" for t in (1, 2, 4) for m in (0.8, 0.9)],
                          "throughput_tok_s": [1000, 1200, 2100, 2500, 3900, 4100],
                          "p99_latency_s": [2.0, 2.5, 1.2, 1.6, 0.9, 1.4], "cost": [1, 1, 2, 2, 4, 4]})
    figs["frontier"] = plots.plot_frontier(sweep, slo_s=1.5)
    figs["frontier_no_cost"] = plots.plot_frontier(sweep.drop(columns="cost"))
    for name, fig in figs.items():
        assert_readable(fig, name)
    assert [ln.get_label() for ln in figs["memory"].axes[0].get_lines()] == ["fits", "retracts"]


def test_a_100k_step_run_renders_in_seconds_with_bounded_vertices():
    steps, requests, summary = big_run()
    t0 = time.perf_counter()
    figs = [plots.plot_memory_timeline(steps, requests, summary["pools"], 1152),
            plots.plot_queue(steps, 512), plots.plot_prefix_cache(steps, requests), plots.plot_latency(requests),
            plots.plot_fragmentation(steps, requests, summary)]
    for fig in figs:
        drawn(fig)
    elapsed = time.perf_counter() - t0
    assert elapsed < 15, f"{elapsed:.1f} s"  # about 2 s on one core; generous for a loaded 2-core CI box
    kv = figs[0].axes[0]
    assert kv.get_ylim()[1] == pytest.approx(2 * CAPACITY * 1.04)  # two replicas summed
    for c in kv.collections:
        assert sum(len(p.vertices) for p in c.get_paths()) <= 4 * plots.MAX_BINS + 16


def test_the_readability_check_catches_a_clipped_legend_and_a_missing_label():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))  # no constrained layout: a legend outside the axes runs off the figure
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a long legend entry that does not fit")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("tokens")
    with pytest.raises(AssertionError):
        assert_readable(fig, "clipped")
    fig = Figure(figsize=(4, 3), layout="constrained")
    fig.subplots().plot([0, 1], [0, 1])
    with pytest.raises(AssertionError):
        assert_readable(fig, "unlabelled")


def test_hybrid_compare_draws_what_run_json_has():
    fig = plots.plot_hybrid_compare({"context_len": [1024, 2048, 4096], "hybrid_bytes_per_request": [1e8, 1.1e8, 1.2e8]})
    assert_readable(fig, "partial hybrid_compare")
    ax_b, ax_c = fig.axes
    assert [ln.get_label() for ln in ax_b.get_lines()] == ["hybrid (KDA state + MLA KV)"]
    assert ax_b.get_yscale() == "linear"  # under a decade: plain numbers, not 1.1 x 10^-1
    assert [t.get_text() for t in ax_c.texts] == ["no max concurrency in run.json"]


def test_fragmentation_shows_the_summary_means(run_dirs):
    steps, requests, summary, _ = read_run(run_dirs["fits"])  # page_size 16: partial pages exist
    fig = plots.plot_fragmentation(steps, requests, summary)
    partial, lost, _ = fig.axes
    mean = summary["fragmentation"]["mean_partial_page_tokens"]
    assert mean > 0
    assert [ln.get_ydata()[0] for ln in partial.get_lines() if ln.get_linestyle() == "--"] == [pytest.approx(mean)]
    total = summary["fragmentation"]["tokens_not_cached_at_finish"]
    assert lost.get_title(loc="left") == f"KV not cached at finish: {total} tokens in all"
    assert sum(p.get_height() for p in lost.patches) == (~requests["aborted"]).sum()


def test_frontier_legend_names_only_what_is_drawn():
    # b beats a on both axes: the frontier is one point, no line, so "frontier" must not be in the legend
    one = pd.DataFrame({"label": ["a", "b"], "throughput_tok_s": [100, 200], "p99_latency_s": [2.0, 1.0]})
    ax = plots.plot_frontier(one).axes[0]
    assert ax.get_legend() is None and ax.get_lines() == []
    ax = plots.plot_frontier(one, slo_s=1.5).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p99 SLO 1.50 s"]
    two = pd.DataFrame({"label": ["a", "b"], "throughput_tok_s": [100, 200], "p99_latency_s": [1.0, 2.0]})
    ax = plots.plot_frontier(two).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["frontier"]
    assert ax.get_lines()[0].get_xdata().tolist() == [1.0, 2.0]


def test_close_throughputs_are_drawn_from_zero_and_spread_ones_are_not():
    close = pd.DataFrame({"label": ["a", "b", "c"], "throughput_tok_s": [142.1, 142.5, 142.9],
                          "p99_latency_s": [1.0, 3.0, 6.0]})
    ax = plots.plot_frontier(close).axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 142.9  # a 0.5 % difference stays a 0.5 % difference
    assert ax.get_xlim()[0] < 1.0 and ax.get_xlim()[0] != 0  # latencies 1-6 s are a real spread: autoscaled
    spread = close.assign(throughput_tok_s=[50.0, 100.0, 200.0])
    assert plots.plot_frontier(spread).axes[0].get_ylim()[0] > 0


def test_the_queue_draws_running_and_waiting_on_their_own_axes():
    n = 200
    steps = pd.DataFrame({"time_s": np.linspace(0, 10, n), "duration_s": 0.05, "replica": 0,
                          "running": 200, "waiting": np.linspace(0, 250_000, n).astype(int)})
    fig = plots.plot_queue(steps, 256)
    run_ax, wait_ax = fig.axes[:2]
    assert run_ax.get_ylim()[1] < 1_000  # 200 running requests fill their axis, not 0.1 % of a 250k one
    assert wait_ax.get_ylim()[1] >= 250_000
