"""The whole pipeline on the bundled trace: golden summaries, dp routing, mixed chunks, debug checks."""

import json
import os
from pathlib import Path

import pytest

from poolsim.app.run import simulate
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.traces import DEFAULT_TRACE, load_trace, scale_trace, slice_trace

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "llama-3.1-8b_H100": ("llama-3.1-8b", "H100", ServerArgs()),
    "kimi-linear-48b-a3b_H200": ("kimi-linear-48b-a3b", "H200", ServerArgs()),
    "qwen3-8b_L40S_page16_plain": ("qwen3-8b", "L40S", ServerArgs(page_size=16, disable_overlap_schedule=True,
                                                                   mem_fraction_static=0.8)),
}
STABLE_KEYS = ("requests", "finished", "aborted", "retractions", "steps", "prefill_tokens",
               "cached_prefill_tokens", "evicted_tokens", "peak_waiting", "duration_s", "cache_hit_rate",
               "binding_pool", "verdict")


def _run(name, trace=None, **kw):
    model, gpu, args = CASES[name]
    return simulate(trace or load_trace(DEFAULT_TRACE), ModelConfig.load(model), get_gpu(gpu), args, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_golden_summary_of_the_bundled_trace(name):
    """Regression guard: these figures change only when simulated behaviour changes (then regenerate
    with UPDATE_GOLDEN=1 and explain why in the commit)."""
    summary = _run(name).summary
    got = {k: summary[k] for k in STABLE_KEYS}
    got["ttft_p50_s"] = summary["ttft_s"]["p50"]
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=2) + "\n")
    want = json.loads(path.read_text())
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], float):
            assert got[key] == pytest.approx(want[key], rel=1e-9), key
        else:
            assert got[key] == want[key], key


def test_same_inputs_same_csv_bytes():
    a, b = _run("llama-3.1-8b_H100"), _run("llama-3.1-8b_H100")
    assert a.steps.to_csv(index=False) == b.steps.to_csv(index=False)
    assert a.requests.to_csv(index=False) == b.requests.to_csv(index=False)


def test_cache_aware_router_keeps_sessions_together():
    """dp 2: round robin splits a chat's turns across replicas, so a turn often misses the KV its
    previous turn left on the other replica; the cache-aware router sends it where its prefix is."""
    model, gpu = ModelConfig.load("llama-3.1-8b"), get_gpu("H100")
    trace = load_trace(DEFAULT_TRACE)
    rr = simulate(trace, model, gpu, ServerArgs(dp_size=2), router="round_robin")
    ca = simulate(trace, model, gpu, ServerArgs(dp_size=2), router="cache_aware")
    assert set(rr.requests["replica"]) == {0, 1} and set(ca.requests["replica"]) == {0, 1}
    assert ca.summary["cache_hit_rate"] > rr.summary["cache_hit_rate"]
    assert rr.summary["finished"] == ca.summary["finished"] == len(trace)


def test_mixed_chunk_runs_decode_inside_prefill_batches():
    model, gpu = ModelConfig.load("llama-3.1-8b"), get_gpu("H100")
    r = simulate(load_trace(DEFAULT_TRACE), model, gpu, ServerArgs(enable_mixed_chunk=True))
    mixed = r.steps[r.steps["kind"] == "mixed"]
    assert len(mixed) > 0 and (mixed["decode_tokens"] > 0).all() and (mixed["prefill_tokens"] > 0).all()
    assert r.summary["finished"] == len(r.requests)


@pytest.mark.parametrize("model,gpu,args", [
    ("kimi-linear-48b-a3b", "H200", ServerArgs(max_total_tokens=20_000)),
    ("kimi-linear-48b-a3b", "H200", ServerArgs(disable_overlap_schedule=True, mamba_radix_cache_strategy="no_buffer",
                                               max_mamba_cache_size=40, max_total_tokens=20_000)),
    ("llama-3.1-8b", "H100", ServerArgs(page_size=16, max_total_tokens=6_000)),
    ("llama-3.1-8b", "H100", ServerArgs(disable_radix_cache=True, max_total_tokens=12_000)),
    ("llama-3.1-8b", "H100", ServerArgs(max_total_tokens=12_000, enable_mixed_chunk=True, chunked_prefill_size=512)),
])
def test_every_step_conserves_every_pool(model, gpu, args):
    """Debug mode: after every step, free + evictable + protected + request-owned == capacity for KV,
    and each pool's own invariants (no slot twice, slot 0 never handed out), under memory pressure:
    the first two minutes of the bundled trace at 8x its rate through small pools."""
    trace = scale_trace(slice_trace(load_trace(DEFAULT_TRACE), 0, 120), 8)
    r = simulate(trace, ModelConfig.load(model), get_gpu(gpu), args, check=True)
    assert r.summary["finished"] + r.summary["aborted"] == len(r.requests) == len(trace)
    if not args.disable_radix_cache:
        assert r.summary["evicted_tokens"] > 0  # the pools really were under pressure


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_cycle_collector_is_paused_for_the_loop_and_restored(enabled_before):
    import gc
    seen = []
    trace = slice_trace(load_trace(DEFAULT_TRACE), 0, 20)
    (gc.enable if enabled_before else gc.disable)()
    try:
        _run("llama-3.1-8b_H100", trace, progress=lambda done, now: seen.append(gc.isenabled()))
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()
    assert seen and not any(seen)  # off during the event loop
