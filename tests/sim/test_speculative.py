"""Issue #36: speculative decoding in the scheduler and pools (SGLang 0.5.23's EAGLE v2 worker).

Hand-derived from the wheel: each decode step grows every row to ``ceil_page(kv_committed_len + 2 x alloc_len)``
(speculative/eagle_utils.py:857-921, mem_cache/allocation_sizing.py:28-93), allocated in batch order from the
allocator's head (mem_cache/allocation.py:780-848); the verify result commits the accepted run
(batch_result_processor.py:818-850); what is reserved past the kept KV is freed at release
(mem_cache/common.py:447-476); ``check_decode_mem`` and the retraction loop ask for the same reservation
(managers/schedule_batch.py:3421-3540). Steps 3, topk 1, draft tokens 4: alloc_len 4, reservation 8.
"""

import json

import numpy as np
import pytest

from poolsim.sim.req import Req
from poolsim.sim.scheduler import SchedulerConfig
from poolsim.sim.server import build_server
from poolsim.sim.speculative import Acceptance, AcceptanceSampler, SpecDecodeConfig
from tests.helpers import TraceReq, run_sim


def spec(accept, steps=3, topk=1, tokens=4):
    """``accept``: a constant accept length, or an Acceptance."""
    if not isinstance(accept, Acceptance):
        probs = [0.0] * (steps + 1)
        probs[accept - 1] = 1.0
        accept = Acceptance(tuple(probs), f"always {accept}")
    return SpecDecodeConfig(steps, topk, tokens, max(steps * topk, tokens), accept)


def server(pool, page=1, rows=4, ctx=512, accept=3, **kw):
    config = SchedulerConfig(page_size=page, max_total_num_tokens=pool, max_running_requests=rows, context_len=ctx,
                             max_context_len=ctx + 64, chunked_prefill_size=8192, enable_overlap=False,
                             speculative=spec(accept), **kw)
    return build_server(config)


def add(sched, rid, prompt_len, max_new, base=None):
    base = 1000 * (rid + 1) if base is None else base
    req = Req(rid, TraceReq(rid, 0.0, list(range(base, base + prompt_len)), max_new), max_new)
    sched.add_request(req)
    return req


def step(sched, t=[0.0]):
    """One iteration of the plain (non-overlap) loop: schedule, run, process."""
    batch = sched.get_next_batch_to_run()
    t[0] += 0.01
    if batch is not None:
        sched.process_batch_result(batch, t[0], sched.forward_ct)
        sched.forward_ct += 1
    sched.last_batch = batch
    return batch


def row(sched, req, start, stop):
    return sched.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:stop].tolist()


def free_list(sched):
    return np.asarray(sched.allocator.free_pages).tolist()


# ---- one decode step at page 1 --------------------------------------------------------------------


def test_decode_step_allocations_and_frees_at_page_1():
    s = server(64)
    a, b = add(s, 0, 5, 10), add(s, 1, 4, 10)
    step(s)  # prefill: 9 slots from the head, A then B
    assert row(s, a, 0, 5) == [1, 2, 3, 4, 5] and row(s, b, 0, 4) == [6, 7, 8, 9]
    assert (a.kv.kv_committed_len, a.kv.kv_allocated_len, a.num_output) == (5, 5, 1)

    batch = step(s)  # decode 1: A 5 -> ceil(5 + 8) = 13, B 4 -> 12: 16 slots, A's first
    assert batch.forward_mode == "decode" and batch.decode_seq_lens_sum == 5 + 4  # committed: what is attended to
    assert row(s, a, 5, 13) == list(range(10, 18)) and row(s, b, 4, 12) == list(range(18, 26))
    assert (a.kv.kv_allocated_len, b.kv.kv_allocated_len) == (13, 12)
    # the verify accepted 3 (2 drafts + the bonus): committed and output move by 3, nothing is freed
    assert (a.kv.kv_committed_len, a.num_output, b.kv.kv_committed_len, b.num_output) == (8, 4, 7, 4)
    assert s.allocator.available_size() == 64 - 9 - 16

    step(s)  # decode 2: A 13 -> max(13, 8 + 8) = 16, B 12 -> 15: three slots each, in batch order
    assert row(s, a, 13, 16) == [26, 27, 28] and row(s, b, 12, 15) == [29, 30, 31]
    step(s)  # decode 3: A 16 -> 19 ([32, 33, 34]), B 15 -> 18 ([35, 36, 37]); both reach 10 outputs and finish
    assert a.finished_reason == b.finished_reason == "length" and (a.num_output, b.num_output) == (10, 10)
    # A: committed 14 = owned min(14, 5 + 10): the tree keeps row[0:14]; the reservation past it, positions 14..18
    # (slots 27, 28 of decode 2 and 32, 33, 34 of decode 3), held the rejected drafts: freed at release, in row
    # order, at the free list's tail (FIFO). B: committed 13 = owned min(13, 4 + 10); positions 13..17.
    a_over, b_over = [27, 28, 32, 33, 34], [30, 31, 35, 36, 37]
    assert free_list(s)[-10:] == a_over + b_over
    assert s.allocator.available_size() + s.tree_cache.evictable_size() == 64


def test_overlap_reserves_against_the_lagging_commit():
    """Overlap: decode 2 is planned before decode 1's result: committed is still 5, so A needs nothing more (its
    8-slot reservation is the double buffer, allocation_sizing.py:64-70); decode 3 then sees committed 8."""
    config = SchedulerConfig(page_size=1, max_total_num_tokens=64, max_running_requests=4, context_len=512,
                             max_context_len=576, enable_overlap=True, speculative=spec(3))
    trace = [TraceReq(0, 0.0, list(range(1, 6)), 10)]
    steps, reqs, _ = run_sim(trace, config)
    # prefill 5; decode 1: +8 (5 -> 13); decode 2 (committed 5): +0; decode 3 (committed 8): 13 -> 16
    assert steps["available_size"].tolist()[:4] == [59, 51, 51, 48]
    assert reqs["output_len"].tolist() == [10]


# ---- one decode step at page 64 -------------------------------------------------------------------


def test_decode_step_allocations_and_frees_at_page_64():
    s = server(512, page=64)
    a, b = add(s, 0, 100, 5), add(s, 1, 64, 40)
    step(s)  # prefill: A pages 1-2 (slots 64..163), B page 3 (192..255); pages 4..8 free
    assert row(s, a, 0, 100) == list(range(64, 164)) and row(s, b, 0, 64) == list(range(192, 256))
    assert free_list(s) == [4, 5, 6, 7, 8]

    step(s)  # decode 1: A 100 -> ceil64(100 + 8) = 128 inside page 2; B 64 -> 128: one new page, 4
    assert row(s, a, 100, 128) == list(range(164, 192)) and row(s, b, 64, 128) == list(range(256, 320))
    assert free_list(s) == [5, 6, 7, 8] and (a.kv.kv_allocated_len, b.kv.kv_allocated_len) == (128, 128)
    assert (a.kv.kv_committed_len, b.kv.kv_committed_len) == (103, 67)

    step(s)  # decode 2: A max(128, ceil64(111)) = 128, B ceil64(75) = 128: nothing allocated
    # A's accepted run passed max_new 5 (4 + 3): output cut at 5, KV committed whole (106); owned min(106, 105):
    # the tree keeps its first page [0, 64); page 2 (its tail and its reservation) is freed, to the front
    assert (a.finished_reason, a.num_output, a.kv.kv_committed_len) == ("length", 5, 106)
    assert free_list(s) == [2, 5, 6, 7, 8] and s.tree_cache.evictable_size() == 64
    assert (b.kv.kv_committed_len, b.kv.kv_allocated_len) == (70, 128)


# ---- retraction with the speculative reservation --------------------------------------------------


def test_retraction_with_the_speculative_reservation():
    """Pool 40, two 10-token prompts, max_new 8, accept length 1 (only the bonus token).

    Prefill: 20 slots. Decode 1: each row grows to 10 + 8 = 18 (16 slots): 4 left. Decode 2 (committed 11): one
    slot each, 2 left; decode 3: the last 2. Decode 4 (committed 13) asks for 2, 0 free, nothing evictable (the
    prompts are locked): retract. Equal outputs (4) and prompts: B, popped last, goes: its 3 computed slots and the
    7 reserved past them (row[10:20]) are freed without insert, and the 20-token headroom for A evicts B's unlocked
    10-token prompt; new_token_ratio = min(1, (4 + 20) / (8 + 1)) = 1. Without speculation the same two requests
    need 1 slot a step each and never run short (20 + 2 x 7 = 34 < 40)."""
    s = server(40, accept=1)
    a, b = add(s, 0, 10, 8), add(s, 1, 10, 8)
    step(s)
    for _ in range(3):
        step(s)
    assert s.allocator.available_size() == 0 and s.step_retracted == 0
    b_owned = row(s, b, 10, 20)
    assert (b.kv.kv_committed_len, b.kv.kv_allocated_len) == (13, 20)
    step(s)
    assert s.step_retracted == 1 and b.is_retracted and b.retraction_count == 1 and not a.is_retracted
    assert s.new_token_ratio.current == 1.0
    assert s.waiting_queue == [b] and s.running_batch.reqs == [a]
    assert s.tree_cache.num_evicted_tokens == 10
    # A decoded on: its row grew by one slot (committed 13 + 8 = 21), the head of the free list: B's first freed
    # slot; the rest of B's follow, then its evicted prompt
    assert a.kv.kv_allocated_len == 21 and row(s, a, 20, 21) == b_owned[:1]
    assert free_list(s)[:9] == b_owned[1:]
    # the same trace without speculation: no retraction
    plain = SchedulerConfig(page_size=1, max_total_num_tokens=40, max_running_requests=4, context_len=512,
                            enable_overlap=False)
    steps, _, _ = run_sim([TraceReq(0, 0.0, list(range(1000, 1010)), 8),
                           TraceReq(1, 0.0, list(range(2000, 2010)), 8)], plain)
    assert steps["retracted"].sum() == 0


# ---- acceptance --------------------------------------------------------------------------------------


def test_acceptance_from_a_mean_is_a_geometric_chain():
    acc = Acceptance.from_mean(3.0, 4)
    assert acc.mean == pytest.approx(3.0)
    p = acc.probabilities[1] / acc.probabilities[0] if acc.probabilities[0] else 1.0
    # P(L = k) = p^(k-1) (1 - p) below the cap, p^(K-1) at it
    assert acc.probabilities[2] == pytest.approx(acc.probabilities[1] * p)
    assert Acceptance.from_mean(1.0, 4).probabilities == (1.0, 0.0, 0.0, 0.0)
    assert Acceptance.from_mean(4.0, 4).probabilities[-1] == 1.0
    with pytest.raises(ValueError, match="commits 1 to 4"):
        Acceptance.from_mean(4.5, 4)


def test_acceptance_file_is_a_histogram_of_accepted_drafts(tmp_path):
    path = tmp_path / "accept.json"
    path.write_text(json.dumps([10, 30, 60]))  # 0, 1 and 2 drafts accepted: accept lengths 1, 2, 3
    acc = Acceptance.from_file(path, 4)
    assert acc.probabilities == (0.1, 0.3, 0.6, 0.0) and acc.mean == pytest.approx(2.5)
    path.write_text(json.dumps([1, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match="at most num_steps = 3"):
        Acceptance.from_file(path, 4)
    path.write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match="a JSON list of non-negative numbers"):
        Acceptance.from_file(path, 4)


def test_draws_are_deterministic_per_request_and_position():
    config = spec(Acceptance.from_mean(2.5, 4))
    one, two = AcceptanceSampler(config), AcceptanceSampler(config)
    draws = [one.draw(7, n) for n in range(2000)]
    assert draws == [two.draw(7, n) for n in range(2000)]
    assert np.mean(draws) == pytest.approx(2.5, abs=0.1)
    other_seed = AcceptanceSampler(SpecDecodeConfig(3, 1, 4, 4, config.acceptance, seed=1))
    assert [other_seed.draw(7, n) for n in range(200)] != draws[:200]
    assert one.stats()["verify_steps"] == 2000 and one.stats()["accepted_tokens"] == sum(draws)


def test_an_accepted_run_stops_at_eos():
    """EOS inside the run: the output stops there (a stop finish), the KV is committed whole."""
    config = SchedulerConfig(page_size=1, max_total_num_tokens=64, max_running_requests=4, context_len=512,
                             max_context_len=576, enable_overlap=False, speculative=spec(4))
    # output_len 3 (EOS at the 3rd token), max_new 10: prefill 1, then a run of 4 -> cut at 3
    steps, reqs, _ = run_sim([TraceReq(0, 0.0, list(range(1, 6)), 3, max_new_tokens=10)], config)
    assert reqs["output_len"].tolist() == [3] and len(steps) == 2


# ---- the step time and the targets ---------------------------------------------------------------------


@pytest.fixture
def eagle3_llama(tmp_path):
    from tests.sizing.test_speculative import EAGLE3_LLAMA_8B

    path = tmp_path / "eagle3.json"
    path.write_text(json.dumps(EAGLE3_LLAMA_8B))
    return str(path)


def _clock(draft, **flags):
    from poolsim.app.run import _step_time
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.plan import plan_memory
    from poolsim.pools.sizing.server_args import ServerArgs

    model, gpu = ModelConfig.load("llama-3.1-8b"), get_gpu("h100")
    args = ServerArgs(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                      speculative_accept_length=2.0, **flags)
    plan = plan_memory(model, gpu, args)
    return _step_time("analytic", model, gpu, plan, None, args)


def test_verify_is_weight_bound_at_small_batch_and_compute_bound_at_large(eagle3_llama):
    clock = _clock(eagle3_llama, speculative_num_steps=3, speculative_eagle_topk=1)  # 4 draft tokens
    c = clock.cost

    def verify(bs, seq=1024):
        d = 4
        return clock.forward_s(c, 0, bs * d, 0, d * bs * seq + bs * d * (d + 1) // 2, bs * seq, bs, True)

    def decode(bs, seq=1024):
        return clock.forward_s(c, 0, bs, 0, bs * seq, bs * seq, bs, True)

    # one request: 4 tokens read the same weights as 1: the verify costs about a decode step
    assert verify(1) == pytest.approx(decode(1), rel=0.05)
    # 512 requests x 4 tokens: the GEMMs bind, the time follows the tokens (short contexts: the KV reads are small)
    assert verify(512, 64) / verify(256, 64) == pytest.approx(2.0, rel=0.1)
    assert verify(512, 64) > 2.5 * decode(512, 64)


def test_a_decode_step_is_verify_plus_draft_passes(eagle3_llama):
    clock = _clock(eagle3_llama, speculative_num_steps=3, speculative_eagle_topk=1)
    t = clock.spec_time_of("decode", 0, 0, 0, 1, 1024, 1)
    stats = clock.spec_stats()
    assert t == pytest.approx(stats["verify_s"] + stats["draft_s"] + clock.k.step_overhead_s)
    # 3 draft passes: 2 draft decodes and the draft extend, each with the draft's 1 layer
    one_pass = clock.forward_s(clock.spec.draft, 0, 1, 0, 1025, 1024, 1, True)
    assert stats["draft_s"] == pytest.approx(3 * one_pass, rel=0.05)
    assert 0 < stats["draft_overhead"] < 0.5


@pytest.mark.parametrize("accept, check", [(1.0, "no faster"), (3.0, "1.8x")])
def test_bench_targets_at_concurrency_1(eagle3_llama, accept, check):
    """bench at concurrency 1: accept length 1.0 (only the bonus token) is no faster than without speculation;
    3.0 is at least 1.8x faster per output token."""
    from poolsim.app.bench_serving import BenchConfig, run_bench
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs

    model, gpu = ModelConfig.load("llama-3.1-8b"), get_gpu("h100")
    cfg = [BenchConfig(num_prompts=6, random_input_len=256, random_output_len=128, max_concurrency=1)]
    _, (plain,) = run_bench(cfg, model, gpu, ServerArgs())
    result, (spec_m,) = run_bench(cfg, model, gpu, ServerArgs(
        speculative_algorithm="EAGLE3", speculative_draft_model_path=eagle3_llama, speculative_accept_length=accept))
    assert spec_m["accept_length"] == pytest.approx(accept, abs=0.35)
    assert result.summary["speculative_draft_overhead"] > 0
    if check == "no faster":
        assert spec_m["mean_tpot_ms"] >= plain["mean_tpot_ms"]
        assert spec_m["output_throughput"] <= plain["output_throughput"]
    else:
        assert plain["mean_tpot_ms"] / spec_m["mean_tpot_ms"] >= 1.8


def test_run_needs_an_acceptance(eagle3_llama):
    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs

    args = ServerArgs(speculative_algorithm="EAGLE3", speculative_draft_model_path=eagle3_llama)
    with pytest.raises(ValueError, match="give --speculative-accept-length MEAN"):
        simulate([], ModelConfig.load("llama-3.1-8b"), get_gpu("h100"), args)


def test_summary_keys_are_spec_summarys_and_empty_when_off():
    from poolsim.reports.summary import SPECULATIVE_KEYS, summarize
    from poolsim.sim.speculative import spec_summary

    sampler = AcceptanceSampler(spec(2))
    assert tuple(spec_summary("EAGLE", 4, [sampler], spec(2).acceptance, None)) == SPECULATIVE_KEYS
    steps, reqs, _ = run_sim([TraceReq(0, 0.0, [1, 2, 3], 3)], SchedulerConfig(
        page_size=1, max_total_num_tokens=64, max_running_requests=4, context_len=64))
    summary = summarize(steps, reqs, {"max_total_num_tokens": 64, "max_running_requests": 4, "page_size": 1,
                                      "context_len": 64, "dp_size": 1})
    assert all(summary[k] is None for k in SPECULATIVE_KEYS)


def test_the_report_shows_the_speculative_numbers_only_for_a_speculative_run():
    from poolsim.reports.tables import summary_tables

    titles = lambda s: [g["title"] for g in summary_tables(s)["groups"]]  # noqa: E731
    base = {"requests": 1, "pools": {}, "speculative_algorithm": "", "speculative_accept_length": None}
    assert "Speculative decoding" not in titles(base)
    spec = {**base, "speculative_algorithm": "EAGLE3", "speculative_accept_length": 2.5,
            "speculative_tokens_per_step": 40.0, "speculative_draft_overhead": 0.2}
    group = next(g for g in summary_tables(spec)["groups"] if g["title"] == "Speculative decoding")
    assert [r["raw"] for r in group["rows"]] == ["EAGLE3", "2.5", "40.0", "0.2"]
