"""The scheduler on two KV pools (hybrid SWA): SGLang's SWA admission rule and the decode window release,
with conservation of both pools checked at every step (run_sim's check)."""

import pytest

from poolsim.reports.summary import summarize
from poolsim.sim.scheduler import SchedulerConfig
from poolsim.sim.server import SWAConfig, build_server
from poolsim.sim.swa_prefill_adder import estimate_swa_kv_tokens
from tests.helpers import TraceReq, run_sim


def config(full):
    return SchedulerConfig(page_size=1, max_total_num_tokens=full, max_running_requests=4, context_len=1024)


def test_estimate_swa_kv_tokens_by_hand():
    # extend 8192 capped by the chunk (8192): the tail past the window 8064, + min(8192 + 100, 128) + page 1
    assert estimate_swa_kv_tokens(8192, 100, 128, 1, 8192) == 8064 + 128 + 1
    # a chunk limit bounds the tail only: 4096 - 128 + 128 + 64
    assert estimate_swa_kv_tokens(8192, 0, 128, 64, 4096) == 4096 - 128 + 128 + 64
    # shorter than the window: extend + max_new + page
    assert estimate_swa_kv_tokens(40, 30, 128, 1) == 40 + 30 + 1


def test_the_swa_pool_admits_one_request_where_the_full_pool_alone_admits_two():
    # each request: 40 prompt + 30 output, window 8: SWA reservation 32 + min(70, 8) + 1 = 41
    trace = [TraceReq(0, 0.0, range(1, 41), 30), TraceReq(1, 0.0, range(101, 141), 30)]
    steps, reqs, _ = run_sim(trace, config(256), swa=SWAConfig(swa_max_total_num_tokens=64, sliding_window_size=8))
    # A fits (41 < 64); then 64 - 41 = 23 SWA tokens remain: B (41) waits, though the full pool has room
    first = steps[steps["kind"] != "idle"].iloc[0]
    assert (first["kind"], first["batch_size"], first["prefill_tokens"]) == ("extend", 1, 40)
    assert list(reqs["aborted"]) == [False, False] and list(reqs["output_len"]) == [30, 30]
    steps1, _, _ = run_sim(trace, config(256))
    one_pool = steps1[steps1["kind"] != "idle"].iloc[0]
    assert (one_pool["batch_size"], one_pool["prefill_tokens"]) == (2, 80)


def test_decode_releases_swa_kv_that_left_the_window():
    # 40 + 150 tokens, window 8. After the prefill the prompt is checkpointed (cache_unfinished_req): key
    # end 40, pre_len 39 frees the SWA of rows [0, 31) and the insert keeps them as a tombstone; the tree
    # now protects [0, 40). Decode frees once seqlen - 1 - 8 >= 31 + 128, i.e. seqlen 168: rows [40, 159)
    # (from the protected 40 up to 167 - 8). The next release would need seqlen 296 > 190. At the finish the
    # insert tombstones [40, 159) too: the tree holds 31 + 119 = 150 fewer SWA tokens than full ones.
    trace = [TraceReq(0, 0.0, range(1, 41), 150)]
    _, reqs, sched = run_sim(trace, config(512), swa=SWAConfig(swa_max_total_num_tokens=160, sliding_window_size=8))
    tree, alloc = sched.tree_cache, sched.allocator
    assert list(reqs["output_len"]) == [150]
    assert tree.evictable_size() - tree.swa_evictable_size() == 31 + 119
    assert alloc.swa_available_size() == 160 - tree.swa_evictable_size()
    assert alloc.full_available_size() == 512 - tree.evictable_size()
    assert tree.num_swa_evicted_tokens == 0  # the pool never ran short: only the window release freed SWA


def test_build_server_refuses_swa_with_a_disabled_cache():
    with pytest.raises(ValueError, match="radix cache on"):
        build_server(config(64), disable_radix_cache=True, swa=SWAConfig(32, 8))


def test_a_prompt_that_never_fits_the_swa_pool_whole_is_chunked_to_fit():
    # 100 prompt + 30 output, window 8, SWA pool 64: it would reserve 92 + 8 + 1 = 101 >= 64, so it is admitted
    # with a chunk leaving room for its decode window: 64 - (min(30, 8) + 1) = 55 tokens. Stashing that chunk
    # frees the SWA of rows [0, 54 - 8 = 46); 55 SWA slots are free again and 1 (the unlocked part of the tree's
    # 9) evictable: the rest of the prompt, 45 tokens, fits the next chunk (min(8192, total, 56 - 1 page)).
    trace = [TraceReq(0, 0.0, range(1, 101), 30)]
    steps, reqs, _ = run_sim(trace, config(512), swa=SWAConfig(swa_max_total_num_tokens=64, sliding_window_size=8))
    extends = steps[steps["kind"] == "extend"]
    assert list(extends["prefill_tokens"]) == [55, 45]
    assert list(reqs["output_len"]) == [30]


def test_a_decode_retraction_the_swa_pool_forced_is_attributed_to_the_swa_pool():
    # Two 10-token prompts + 30 outputs, window 8, SWA pool 50, full pool 256, plain loop, 10 ms steps. Each
    # reserves 2 + min(40, 8) + 1 = 11 < 50 SWA: both prefill at step 0 (20 tokens). The window release needs
    # 128 tokens out of the window, so it never runs; each decode step takes 2 slots of each pool. SWA: 50 - 20 =
    # 30 free after the prefill, and the checkpoint of each prompt leaves 1 token a tombstone (evictable); step k
    # takes 2 more, so after step 17 SWA free + evictable = 30 + 2 - 2 * 16 = 0 (t = 0.17). Scheduling step 18
    # (t = 0.18) needs 2 slots: the full pool has 256 - 20 - 2 * 17 = 202 free, the SWA pool none: the one
    # retraction is the SWA pool's, when the 2 running requests held all 50 SWA tokens (54 full ones).
    cfg = SchedulerConfig(page_size=1, max_total_num_tokens=256, max_running_requests=4, context_len=1024,
                          enable_overlap=False)
    trace = [TraceReq(0, 0.0, range(1, 11), 30), TraceReq(1, 0.0, range(101, 111), 30)]
    steps, reqs, sched = run_sim(trace, cfg, swa=SWAConfig(swa_max_total_num_tokens=50, sliding_window_size=8))
    meta = {"max_total_num_tokens": 256, "max_running_requests": 4, "page_size": 1, "context_len": 1024,
            "dp_size": 1, "retraction_events": sched.retraction_events, "swa_max_total_num_tokens": 50}
    s = summarize(steps, reqs, meta)
    assert s["retractions"] == 1 and list(reqs["output_len"]) == [30, 30]
    assert s["pools"]["kv"]["first_exhausted_s"] is None  # the full pool never ran short
    assert s["pools"]["swa"]["first_exhausted_s"] == pytest.approx(0.17)
    assert s["binding_pool"] == "swa"
    assert s["first_retraction"] == {"time_s": pytest.approx(0.18), "running": 2, "kv_tokens_held": 50,
                                     "pool": "swa"}
    assert "because the next decode step needed more SWA KV than was free: first at t=0.2 s, when 2 running " \
           "requests held 100.0% of 50 SWA KV tokens." in s["verdict"]
    assert "SWA KV tokens bind first: ran out at t=0.2 s, peak 100.0%." in s["verdict"]
