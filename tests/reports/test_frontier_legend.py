"""The sweep plot's legend names only what is drawn: one configuration is a point, not a 'frontier' line."""

import pandas as pd

from poolsim.reports import plots


def _labels(fig):
    legend = fig.axes[0].get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def test_a_single_configuration_has_no_frontier_line_in_the_legend():
    one = pd.DataFrame({"label": ["tp=1"], "throughput_tok_s": [100.0], "p99_latency_s": [2.0]})
    assert _labels(plots.plot_frontier(one)) == []
    assert _labels(plots.plot_frontier(one, slo_s=1.0)) == ["p99 SLO 1.00 s"]


def test_two_frontier_points_are_joined_and_named():
    two = pd.DataFrame({"label": ["a", "b"], "throughput_tok_s": [100.0, 200.0], "p99_latency_s": [1.0, 2.0]})
    fig = plots.plot_frontier(two)
    assert _labels(fig) == ["frontier"]
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "frontier"]
    assert list(line.get_xdata()) == [1.0, 2.0]
