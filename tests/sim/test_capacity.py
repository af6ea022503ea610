"""poolsim capacity: the highest arrival-rate scale at which the verdict and the p99 SLO hold, by search over
whole simulations of the scaled trace."""

import pytest

from poolsim.app.capacity import BISECTIONS, find_capacity
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.reports.plots import plot_capacity
from poolsim.traces import DEFAULT_TRACE, load_trace, slice_trace


@pytest.fixture(scope="module")
def searches():
    trace, model, gpu = load_trace(DEFAULT_TRACE), ModelConfig.load("llama-3.1-8b"), get_gpu("H100")
    return {slo: find_capacity(trace, model, gpu, ServerArgs(), slo) for slo in (10.0, 20.0)}


def test_the_bracket_holds_below_and_fails_above(searches):
    for slo, c in searches.items():
        lo, hi = c.bracket
        by_scale = {p.scale: p for p in c.points}
        assert c.scale == lo and by_scale[lo].holds and not by_scale[hi].holds
        assert by_scale[lo].p99_s <= slo and by_scale[lo].verdict_status != "does_not_fit"
        assert hi / lo <= 2 ** (1 / 2 ** BISECTIONS) + 1e-12  # bisected down to ~1 %
        # the search visits doublings from 1 until one fails, then bisects: every point below lo that was
        # tried holds, every point above hi fails
        assert all(p.holds for p in c.points if p.scale <= lo)
        assert not any(p.holds for p in c.points if p.scale >= hi)
        assert c.best is by_scale[lo] and c.to_dict()["sustained_req_s"] == by_scale[lo].throughput_req_s


def test_a_looser_slo_never_gives_a_lower_capacity(searches):
    assert searches[10.0].scale < searches[20.0].scale
    # at the strict SLO's failing end, only the SLO failed: the looser SLO holds there
    strict = {p.scale: p for p in searches[10.0].points}[searches[10.0].bracket[1]]
    assert strict.p99_s > 10.0


def test_an_unmeetable_slo_has_no_capacity_and_says_so():
    trace = slice_trace(load_trace(DEFAULT_TRACE), 0.0, 20.0)  # a few requests: 13 slowed-down runs stay cheap
    assert 0 < sum(1 for _ in trace) < 60
    c = find_capacity(trace, ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs(), 0.001)
    assert c.scale is None and c.bracket[0] is None and not any(p.holds for p in c.points)
    assert min(p.scale for p in c.points) == 2.0 ** -12
    with pytest.raises(ValueError, match="--slo-p99-s"):
        find_capacity(trace, ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs(), float("nan"))


def test_the_capacity_figure_draws_both_panels(searches):
    c = searches[10.0].to_dict()
    fig = plot_capacity(c["points"], c["slo_p99_s"], c["slo_on"], c["capacity_scale"])
    lat, thr = fig.axes[:2]
    assert lat.get_ylim()[0] == 0 and thr.get_ylim()[0] == 0
    assert "capacity" in lat.get_title()


def test_the_capacity_command_prints_the_answer_and_draws_it(tmp_path, searches):
    import json

    from typer.testing import CliRunner

    from poolsim.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "H100", "--slo-p99-s", "10", "--json",
                              "--plot", str(tmp_path / "cap.png")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["capacity_scale"] == searches[10.0].scale  # the CLI runs the library's search, to the bit
    assert data["sustained_req_s"] == searches[10.0].best.throughput_req_s
    assert (tmp_path / "cap.png").read_bytes().startswith(b"\x89PNG")
    res = runner.invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "H100", "--slo-p99-s", "inf"])
    assert res.exit_code == 2 and "--slo-p99-s inf: expected a positive number of seconds" in res.output
    res = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--grid", "gpu=H100", "--capacity"])
    assert res.exit_code == 2 and "--capacity needs --slo-p99-s" in res.output
    res = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--grid", "gpu=H100", "--capacity",
                              "--slo-p99-s", "10", "--workers", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["configs"][0]["capacity_scale"] == searches[10.0].scale
