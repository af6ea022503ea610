"""Real simulated runs, written as run folders, for the report tests (hand-sized, seeded, a few seconds in all)."""

from __future__ import annotations

import numpy as np

from poolsim.app.output import write_run
from poolsim.pools import MambaCacheParams, MambaStateShape
from poolsim.reports.summary import summarize
from poolsim.sim.scheduler import SchedulerConfig
from poolsim.sim.server import HiCacheConfig, MambaConfig, SWAConfig
from tests.helpers import TraceReq, run_sim

STEP_S = 0.02  # seconds per forward step (FixedStepTime)
SYSTEM_PROMPT = list(range(1, 97))  # 96 tokens every chat request shares


def chat_trace(n: int, seed: int, rate_per_s: float, prompt_len=(20, 120), output_len=(8, 60), long_every=0,
               long_len=0) -> list[TraceReq]:
    """Poisson arrivals; most requests share SYSTEM_PROMPT; every ``long_every``-th one is ``long_len`` tokens."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for rid in range(n):
        t += rng.exponential(1 / rate_per_s)
        own = list(10_000 + rid * 1_000 + np.arange(rng.integers(*prompt_len)))
        prompt = (SYSTEM_PROMPT if rid % 4 else []) + own
        if long_every and rid % long_every == long_every - 1:
            prompt = list(500_000 + rid * 10_000 + np.arange(long_len))
        out.append(TraceReq(rid, round(t, 4), prompt, int(rng.integers(*output_len))))
    return out


def conversation_trace(n: int, turns: int, seed: int, gap_s: float, context_len=(250, 350),
                       output_len=(8, 40)) -> list[TraceReq]:
    """``n`` conversations; turn k of each repeats its whole context so far and adds a few tokens, all the turn-k
    requests ``gap_s`` after the turn-(k-1) ones: a later turn finds its context evicted from a small pool."""
    rng = np.random.default_rng(seed)
    contexts = [list(20_000 + c * 10_000 + np.arange(rng.integers(*context_len))) for c in range(n)]
    out = []
    for turn in range(turns):
        for c in range(n):
            if turn:
                contexts[c] = contexts[c] + list(20_000 + c * 10_000 + 5_000 + turn * 100 + np.arange(20))
            arrival = round(turn * gap_s + c * 0.05, 4)
            out.append(TraceReq(len(out), arrival, contexts[c], int(rng.integers(*output_len))))
    return out


def kimi_mamba(slots: int) -> MambaConfig:
    params = MambaCacheParams(shape=MambaStateShape.kimi_linear(tp=1, num_heads=2, head_dim=4), layers=[0, 1])
    return MambaConfig(max_mamba_cache_size=slots, cache_params=params)


def hybrid_compare() -> dict:
    """A Kimi-Linear-like comparison: 20 KDA layers (fixed state) + 7 MLA layers vs 27 MLA layers."""
    lens = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    state, mla_token, full_token, budget = 42 * 2**20, 7 * 1152, 27 * 1152, 60 * 2**30
    hybrid = [state + n * mla_token for n in lens]
    full = [n * full_token for n in lens]
    return {"context_len": lens, "hybrid_bytes_per_request": hybrid, "full_attn_bytes_per_request": full,
            "hybrid_max_concurrency": [min(1024, budget // b) for b in hybrid],
            "full_attn_max_concurrency": [min(1024, budget // b) for b in full],
            "full_attn_model": "Kimi-Linear full-MLA twin"}


SCENARIOS = {
    # name: (trace, config, mamba, model)
    "fits": (lambda: chat_trace(60, 1, 12.0), {"pool": 4096, "rows": 32, "ctx": 1024, "page": 16}, None, "test-mha-small"),
    "retracts": (lambda: chat_trace(60, 2, 20.0, output_len=(150, 400)), {"pool": 1400, "rows": 16, "ctx": 1024}, None,
                 "test-mha-small"),
    "aborts": (lambda: chat_trace(40, 3, 10.0, long_every=8, long_len=1000), {"pool": 1000, "rows": 8, "ctx": 1024}, None,
               "test-mha-small"),
    "hybrid": (lambda: chat_trace(50, 4, 12.0, output_len=(20, 120)), {"pool": 2400, "rows": 8, "ctx": 1024}, 20,
               "Kimi-Linear-48B-A3B (test-sized)"),
    # two KV pools: the SWA pool (window 32) binds before the full one
    "swa": (lambda: chat_trace(50, 5, 12.0, output_len=(100, 300)),
            {"pool": 4096, "rows": 16, "ctx": 1024, "swa": 900, "window": 32}, None, "gpt-oss-20b (test-sized)"),
    # HiCache: a pool that evicts the shared prompt between requests, a host pool 4x it that keeps it
    "hicache": (lambda: conversation_trace(12, 3, 6, 3.0), {"pool": 1600, "rows": 16, "ctx": 1024, "host": 6400},
                None, "test-mha-small"),
}


def write_scenario(name: str, out_dir, render=None):
    """Simulate scenario ``name`` and write its run folder; ``render(tmp_dir)`` is write_run's ``extra`` hook."""
    make_trace, c, mamba_slots, model = SCENARIOS[name]
    page = c.get("page", 1)
    config = SchedulerConfig(page_size=page, max_total_num_tokens=c["pool"], max_running_requests=c["rows"],
                             context_len=c["ctx"], chunked_prefill_size=256, enable_overlap=True)
    trace = make_trace()
    mamba = kimi_mamba(mamba_slots) if mamba_slots else None
    swa = SWAConfig(c["swa"], c["window"]) if "swa" in c else None
    hicache = HiCacheConfig(host_tokens=c["host"], size_per_token=1152 * 27) if "host" in c else None
    steps, requests, sched = run_sim(trace, config, step=STEP_S, mamba=mamba, check=False, swa=swa, hicache=hicache)
    meta = {"max_total_num_tokens": c["pool"], "max_running_requests": c["rows"], "page_size": page,
            "context_len": c["ctx"], "max_mamba_cache_size": mamba_slots or 0, "dp_size": 1,
            "retraction_events": sched.retraction_events, "swa_max_total_num_tokens": c.get("swa", 0)}
    if hicache is not None:
        tree = sched.tree_cache
        meta["hicache"] = {"host_tokens": c["host"], "size_per_token": hicache.size_per_token,
                           "write_policy": hicache.write_policy, "hicache_ratio": c["host"] / c["pool"],
                           "link_bandwidth_bytes_s": 51.2e9, "storage_backend": None,
                           "recomputed_host_hit_tokens": tree.num_recomputed_host_tokens,
                           "backup_skipped_tokens": tree.num_backup_skipped_tokens,
                           "demoted_tokens": tree.num_demoted_tokens}
    summary = summarize(steps, requests, meta)
    flags = {"page_size": page, "max_total_tokens": c["pool"], "max_running_requests": c["rows"],
             "context_length": c["ctx"], "chunked_prefill_size": 256, "schedule_policy": "fcfs",
             "disable_overlap_schedule": False}
    run = {"poolsim_version": "0.1.0", "model": model, "gpu": "H200 (test-sized pools)", "server_args": flags,
           "trace": {"path": f"tests/reports/scenarios.py:{name}", "name": name, "requests": len(trace),
                     "duration_s": trace[-1].arrival_s},
           "seed": 0, "step_time_model": f"fixed {STEP_S * 1e3:g} ms per step",
           "memory_plan": {"max_total_num_tokens": c["pool"], "cell_size_bytes": 1152 * (7 if mamba else 27),
                           "req_to_token_rows": c["rows"], "max_running_requests": c["rows"],
                           "kv_size_gib": c["pool"] * 1152 * (7 if mamba else 27) / 2**30}}
    if swa:
        run["memory_plan"].update(swa_pool="hybrid", sliding_window=c["window"], full_max_total_num_tokens=c["pool"],
                                  swa_max_total_num_tokens=c["swa"])
    if mamba:
        run["memory_plan"]["mamba"] = {"max_mamba_cache_size": mamba_slots, "bytes_per_slot": 42 * 2**20}
        run["hybrid_compare"] = hybrid_compare()
    return write_run(out_dir, steps, requests, summary, run, extra=render)


if __name__ == "__main__":
    import json
    import sys

    for scenario in SCENARIOS:
        out = write_scenario(scenario, f"{sys.argv[1]}/{scenario}")
        print(scenario, json.loads((out / "summary.json").read_text())["verdict"])
