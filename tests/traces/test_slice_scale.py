"""Time-window slicing and rate scaling of any trace; both stream."""

import math

import pytest

from poolsim.traces import load_trace, mean_rate, scale_trace, slice_trace
from tests.traces.conftest import MOONCAKE_HEAD
from tests.traces.test_mooncake import SNIPPET


def test_slice_window_rebases_and_renumbers(write):
    trace = load_trace(write(SNIPPET))  # arrivals 0, 0.5, 1.5, 2.0, 2.5
    part = slice_trace(trace, 0.5, 2.0)
    assert [(r.rid, r.arrival_s, r.input_len) for r in part] == [(0, 0.0, 1300), (1, 1.0, 600)]
    assert len(part) == 2 and part.format == "mooncake" and part.name == "trace[0.5s:2s]"
    assert [r.arrival_s for r in slice_trace(trace, 0.5, 2.0, rebase=False)] == [0.5, 1.5]
    assert [r.arrival_s for r in slice_trace(trace, 2.0)] == [0.0, 0.5]
    assert len(slice_trace(trace, 10.0, 20.0)) == 0
    with pytest.raises(ValueError):
        slice_trace(trace, 2.0, 1.0)


def test_slice_keeps_identity_and_private_ids_follow_the_new_rid(write):
    trace = load_trace(write(SNIPPET))
    full = list(trace)
    r = next(iter(slice_trace(trace, 1.0)))
    assert r.segments == full[2].segments and r.rid == 0


def test_scale(write):
    trace = load_trace(MOONCAKE_HEAD)
    fast = scale_trace(trace, 2.0)
    assert [r.arrival_s for r in fast] == [r.arrival_s / 2 for r in trace]
    assert [r.segments for r in fast] == [r.segments for r in trace]
    assert mean_rate(fast) == pytest.approx(2 * mean_rate(trace))
    assert len(fast) == 400
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError):
            scale_trace(trace, bad)


def test_slice_of_a_file_trace_is_iterable_more_than_once(write):
    path = write(SNIPPET)
    part = slice_trace(load_trace(path), 0.0, 1.0)
    assert len(part) == 2
    assert [r.input_len for r in part] == [1100, 1300]
    assert [r.input_len for r in part] == [1100, 1300]  # iterable more than once
