"""Seeded generators: arrival processes, lengths, shared prompts, multi-turn history growth, the default trace."""

import math
import shlex
from collections import Counter, defaultdict

import numpy as np
import pytest
from typer.testing import CliRunner

from poolsim import cli
from poolsim.traces import (
    DEFAULT_TRACE,
    DiurnalRate,
    Empirical,
    Fixed,
    LogNormal,
    StepRate,
    Uniform,
    WorkloadSpec,
    agent_spec,
    arrival_times,
    chat_spec,
    generate,
    load_trace,
    parse_length,
    parse_rate,
)
from tests.traces.conftest import REPO


def rng(seed=0):
    return np.random.default_rng(seed)


def test_poisson_arrivals():
    t = arrival_times(rng(), 20000, 4.0)
    gaps = np.diff(t)
    assert np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


def test_gamma_arrivals_have_the_burstiness_asked_for():
    gaps = np.diff(arrival_times(rng(), 20000, 4.0, cv=3.0))
    assert gaps.mean() == pytest.approx(0.25, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_step_rate_inverse_by_hand():
    # 1/s for [0, 10), a pause for [10, 20), then 2/s: 10 expected arrivals by t=10, none more until t=20
    profile = StepRate((0.0, 10.0, 20.0), (1.0, 0.0, 2.0))
    assert profile.inverse(np.array([0.0, 5.0, 10.0, 11.0, 13.0])).tolist() == [0.0, 5.0, 20.0, 20.5, 21.5]
    t = arrival_times(rng(), 5000, profile)
    assert not np.any((t > 10.0) & (t < 20.0))
    with pytest.raises(ValueError):
        StepRate((0.0, 10.0), (1.0, 0.0))  # the last step must not be a pause


def test_diurnal_rate():
    profile = DiurnalRate(mean_rate=10.0, amplitude=0.8, period_s=100.0)
    s = np.linspace(0, 5000, 101)
    assert profile.cumulative(profile.inverse(s)) == pytest.approx(s, abs=1e-6)
    t = arrival_times(rng(), 40000, profile)
    # share of arrivals in the peak half [25, 75) of each period: 1/2 + amplitude / pi = 0.7546
    peak = ((t % 100.0) >= 25.0) & ((t % 100.0) < 75.0)
    assert peak.mean() == pytest.approx(0.5 + 0.8 / math.pi, abs=0.01)


def test_length_distributions():
    assert Fixed(7).sample(rng(), 3).tolist() == [7, 7, 7]
    u = Uniform(3, 5).sample(rng(), 1000)
    assert set(u.tolist()) == {3, 4, 5}
    x = LogNormal(200, 0.5).sample(rng(), 20000)
    assert np.median(x) == pytest.approx(200, rel=0.03)
    assert LogNormal(200, 3.0, 10, 500).sample(rng(), 2000).min() == 10
    assert LogNormal(200, 3.0, 10, 500).sample(rng(), 2000).max() == 500
    e = Empirical((5, 9, 9)).sample(rng(), 3000)
    assert set(e.tolist()) == {5, 9} and (e == 9).mean() == pytest.approx(2 / 3, abs=0.03)
    assert Fixed(0).sample(rng(), 1).tolist() == [1]  # lengths are at least one token


def test_empirical_from_a_trace():
    from tests.traces.conftest import AZURE_HEAD

    trace = load_trace(AZURE_HEAD)
    dist = Empirical.from_trace(trace, "output")
    assert set(dist.sample(rng(), 500).tolist()) <= {r.output_len for r in trace}
    assert parse_length(f"empirical:input,{AZURE_HEAD}").values == tuple(r.input_len for r in trace)


def test_spec_parsers():
    assert parse_length("fixed:64") == Fixed(64)
    assert parse_length("uniform:1,6") == Uniform(1, 6)
    assert parse_length("lognormal:150,0.8,8,2000") == LogNormal(150, 0.8, 8, 2000)
    assert parse_rate("2.5") == 2.5
    assert parse_rate("step:0=2,60=5") == StepRate((0.0, 60.0), (2.0, 5.0))
    assert parse_rate("diurnal:3,0.5,600") == DiurnalRate(3.0, 0.5, 600.0)
    for bad in ("gauss:1", "uniform:1", "fixed:x", "empirical:middle,x"):
        with pytest.raises(ValueError):
            parse_length(bad)
    for bad in ("fast", "-1", "step:0=1,5", "diurnal:1,2"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def _sessions(trace):
    out = defaultdict(list)
    for r in trace:
        out[r.session_id].append(r)
    return out


def test_system_prompt_fanout_is_exact():
    spec = WorkloadSpec(num_sessions=10, system_prompt_len=50, system_prompt_fanout=4)
    firsts = [turns[0].segments[0] for turns in _sessions(generate(spec, seed=1)).values()]
    assert all(n == 50 for _, n in firsts)
    assert sorted(Counter(s for s, _ in firsts).values()) == [2, 4, 4]  # ceil(10 / 4) = 3 prompts


def test_multi_turn_history_growth():
    spec = chat_spec(num_sessions=30, turns=Uniform(2, 6))
    sessions = _sessions(generate(spec, seed=2))
    assert len(sessions) == 30
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        for a, b in zip(turns, turns[1:]):
            assert b.arrival_s >= a.arrival_s
            assert b.segments[:-1] == a.segments + ((a.output_segment, a.output_len),)
            assert b.input_len == a.input_len + a.output_len + b.segments[-1][1]
            # the simulator decodes a.output_tokens(a.output_len): exactly what b's prompt holds next
            done = np.concatenate([a.prompt_tokens(), a.output_tokens(a.output_len)])
            assert np.array_equal(b.prompt_tokens()[:len(done)], done)


def test_same_seed_same_trace():
    spec = chat_spec(num_sessions=15)
    assert list(generate(spec, seed=5)) == list(generate(spec, seed=5))
    assert list(generate(spec, seed=5)) != list(generate(spec, seed=6))


def test_limits():
    spec = chat_spec(num_sessions=40, max_new_tokens=100, max_prompt_len=1500)
    rs = list(generate(spec, seed=0))
    assert max(r.output_len for r in rs) == 100 and all(r.max_new_tokens == 100 for r in rs)
    assert max(r.input_len for r in rs) <= 1500
    rs = list(generate(chat_spec(num_sessions=5, max_new_tokens=64, ignore_eos=True), seed=0))
    assert {(r.output_len, r.ignore_eos) for r in rs} == {(64, True)}
    with pytest.raises(ValueError, match="ignore_eos needs max_new_tokens"):
        chat_spec(ignore_eos=True)


def test_agent_loops_share_a_long_context_and_take_short_turns():
    trace = generate(agent_spec(num_sessions=20), seed=0)
    sessions = _sessions(trace)
    contexts = {turns[0].segments[0] for turns in sessions.values()}
    assert {n for _, n in contexts} == {6000} and len(contexts) == 1  # 20 sessions, 25 per context
    assert np.median([r.output_len for r in trace]) < 100
    assert np.median([len(t) for t in sessions.values()]) >= 5


def test_zero_sessions_is_an_empty_trace():
    assert len(generate(WorkloadSpec(num_sessions=0), seed=0)) == 0


def _readme_command():
    text = (REPO / "traces" / "README.md").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("python cli.py trace generate traces/data/default.jsonl")]
    return shlex.split(line)[2:]  # after "python cli.py"


def test_readme_command_regenerates_the_default_trace(tmp_path):
    args = _readme_command()
    args[args.index("traces/data/default.jsonl")] = str(tmp_path / "default.jsonl")
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "default.jsonl").read_bytes() == DEFAULT_TRACE.read_bytes()


def test_default_trace_has_shared_prompts_and_sessions():
    trace = load_trace(DEFAULT_TRACE)
    assert trace.format == "poolsim" and 200 <= len(trace) <= 500
    rs = list(trace)
    assert rs[-1].arrival_s - rs[0].arrival_s < 600
    sessions = _sessions(rs)
    assert len(sessions) == 120 and max(len(t) for t in sessions.values()) == 5
    assert len({t[0].segments[0] for t in sessions.values()}) == 4  # four 300-token system prompts
    assert 300 < np.median([r.input_len for r in rs]) < 3000 and 10 < np.median([r.output_len for r in rs]) < 1000
