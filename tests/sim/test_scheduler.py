"""Hand-sized scheduler scenarios; every expected value is derived in the comments from docs/sglang.md 6."""

import pytest

from poolsim.sim.scheduler import SchedulerConfig
from tests.helpers import TraceReq, run_sim

STEP = 0.01  # seconds per forward step (FixedStepTime)


def cfg(pool, overlap=False, chunk=8192, rows=4, ctx=64, page=1, **kw):
    return SchedulerConfig(page_size=page, max_total_num_tokens=pool, max_running_requests=rows, context_len=ctx,
                           chunked_prefill_size=chunk, enable_overlap=overlap, **kw)


def prompt(base, n):
    return [base + i for i in range(n)]


@pytest.mark.parametrize("overlap", [False, True])
def test_no_token_blocks_admission_until_a_request_leaves(overlap):
    """Pool 16, two 6-token prompts with 4-token outputs.

    A: extend 6 + max_new 4 + page 1 = 11 < 16 -> admitted; total_offset 11, so B's 11 < 16 - 11 = 5 fails:
    NO_TOKEN sets batch_is_full, which only clears when a request leaves the running batch, although
    the pool keeps room for B all along. A: prefill (step 0) + 3 decodes (steps 1-3) -> 4 tokens.
    B: prefill at step 4, decodes 5-7. B's second decode (step 6) finds 0 free slots: it evicts A's
    3-token output leaf (LRU), leaving A's 6-token prompt node cached.
    """
    trace = [TraceReq(0, 0.0, prompt(1, 6), 4), TraceReq(1, 0.0, prompt(100, 6), 4)]
    steps, reqs, _ = run_sim(trace, cfg(16, overlap))
    assert list(steps["kind"]) == ["extend", "decode", "decode", "decode", "extend", "decode", "decode", "decode"]
    assert list(reqs["admission_steps"]) == ["0", "4"]
    assert list(reqs["finish_step"]) == [3, 7]
    assert list(steps["evicted_tokens"]) == [0, 0, 0, 0, 0, 0, 3, 0]
    assert reqs["output_len"].tolist() == [4, 4]
    # A's first token at the end of step 0, B's at the end of step 4
    assert reqs["first_token_s"].tolist() == pytest.approx([STEP, 5 * STEP])


def test_forced_retraction():
    """Pool 33, A and B: 4-token prompts, 14-token outputs (max_new 14). A arrives at 0, B at 0.005.

    Step 0: A prefills. Step 1: B's budget: total_offset = (14 - 1) x 0.7 = 9.1, avail 33 - 4 = 29,
    B needs 4 + 14 + 1 = 19 < 29 - 9.1 = 19.9 -> admitted. From step 2 both decode, 2 slots a step:
    after step 13 one slot is left; step 14 needs 2 -> retract. Equal outputs (13) and prompts (4):
    the later request, B, goes. Its 12 own slots are freed without insert; the 20-token headroom
    evicts B's now-unlocked 4-token prompt. new_token_ratio = min(1, (13 + 20) / (14 + 1)) = 1.
    A finishes at step 14; B re-prefills all 17 tokens (prompt + 13 outputs, nothing cached) at step 15
    and its first new token is its 14th: it finishes there.
    """
    trace = [TraceReq(0, 0.0, prompt(1, 4), 14), TraceReq(1, 0.005, prompt(100, 4), 14)]
    steps, reqs, _ = run_sim(trace, cfg(33))
    assert steps["retracted"].tolist() == [0] * 14 + [1, 0]
    assert steps["evicted_tokens"].tolist()[14] == 4
    assert steps["new_token_ratio"].iloc[14] == 1.0
    assert steps["available_size"].iloc[13] == 1
    b = reqs.iloc[1]
    assert (b["retraction_count"], b["admission_steps"], b["cached_tokens"]) == (1, "1 15", "0 0")
    assert steps["prefill_tokens"].iloc[15] == 17
    assert reqs["finish_step"].tolist() == [14, 15]
    assert reqs["output_len"].tolist() == [14, 14]


@pytest.mark.parametrize("overlap", [False, True])
def test_chunked_prompt(overlap):
    """chunked_prefill_size 8, a 20-token prompt, 3 outputs: chunks of 8, 8, 4, each published into the
    tree before the next, then 2 decode steps. A chunk's prefix is the request's own earlier chunks, not
    a cache hit, so cached_prefill_tokens stays 0; after the last chunk the tree holds all 20 tokens.
    The overlap loop plans chunk k+1 before chunk k's result lands; timings are the same here."""
    trace = [TraceReq(0, 0.0, prompt(1, 20), 3)]
    steps, reqs, sched = run_sim(trace, cfg(64, overlap, chunk=8))
    assert steps["kind"].tolist() == ["extend"] * 3 + ["decode"] * 2
    assert steps["prefill_tokens"].tolist() == [8, 8, 4, 0, 0]
    assert steps["cached_prefill_tokens"].tolist() == [0, 0, 0, 0, 0]
    assert reqs["admission_steps"].tolist() == ["0"]
    # finished: 20 prompt tokens + the 2 decoded tokens whose KV was computed; a length finish is known
    # in advance, so the overlap loop plans no extra step either
    assert sched.tree_cache.evictable_size() == 22
    r = reqs.iloc[0]
    assert (r["first_token_step"], r["finish_step"]) == (2, 4)
    assert r["ttft_s"] == pytest.approx(3 * STEP)


def test_full_prefix_hit_costs_one_token():
    """A (10-token prompt, 2 outputs) finishes and inserts 11 tokens; B has the same prompt: the len-1 cap
    matches 9, so B prefills 1 token (whose slot is freed as a duplicate when B's prompt is published)."""
    trace = [TraceReq(0, 0.0, prompt(1, 10), 2), TraceReq(1, 1.0, prompt(1, 10), 2)]
    steps, reqs, sched = run_sim(trace, cfg(64))
    assert reqs["cached_tokens"].tolist() == ["0", "9"]
    b_prefill = steps[(steps["kind"] == "extend") & (steps["time_s"] >= 1.0)].iloc[0]
    assert (b_prefill["prefill_tokens"], b_prefill["cached_prefill_tokens"]) == (1, 9)
    # A's tokens (10 prompt + 1 decoded) and B's decoded token stay cached; nothing leaked
    assert sched.tree_cache.evictable_size() == 12
    assert sched.allocator.available_size() == 64 - 12


@pytest.mark.parametrize("overlap", [False, True])
def test_too_long_prompt_is_prefilled_as_one_token_then_aborted(overlap):
    """Pool 40, context 64: max_req_len = min(63, 39) = 39, max_req_input_len = 39 - 5 = 34.

    A (38 tokens >= 34) is not dropped at intake (``_handle_generate_request``): max_new_tokens is clipped
    with its real length, min(4, 39 - 38 - 1) = 0, then ``set_finish_with_abort`` makes its prompt [0].
    Step 0 admits A first (fcfs): extend 1 + max_new 0 + page 1 = 2 < 40; offset 2. B (33 tokens, max_new
    min(4, 39 - 33 - 1, 40 - 33 - 1 - 1) = 4) needs 33 + 4 + 1 = 38 < 40 - 2 = 38: no -> NO_TOKEN. Step 0
    is a 1-token prefill of A alone; its result makes A an abort (output_len 1) and publishes its one KV
    token into the tree (evictable 1, available 39). B is admitted at step 1 (38 < 39 + 1) and decodes in
    steps 2-4. Overlap: step 1 is planned before A's result lands; A finishes by length in flight
    (0 + 1 >= 0), so it is skipped, nothing runs, the result lands, and B is admitted as step 1 as well."""
    trace = [TraceReq(0, 0.0, prompt(1, 38), 4), TraceReq(1, 0.0, prompt(100, 33), 4)]
    steps, reqs, sched = run_sim(trace, cfg(40, overlap))
    assert steps["kind"].tolist() == ["extend", "extend", "decode", "decode", "decode"]
    assert steps["prefill_tokens"].tolist() == [1, 33, 0, 0, 0]
    # the abort is counted in the first row written after step 0's result lands: step 0's own row on the
    # plain loop, step 1's under overlap (rows are written after the previous step's result there)
    assert steps["aborted"].tolist() == ([0, 1, 0, 0, 0] if overlap else [1, 0, 0, 0, 0])
    a, b = reqs.iloc[0], reqs.iloc[1]
    assert (a["input_len"], a["max_new_tokens"], a["output_len"]) == (38, 0, 1)
    assert (a["finished_reason"], a["abort_cause"], a["admission_steps"], a["finish_step"]) == \
        ("abort", "input_too_long", "0", 0)
    assert (b["finished_reason"], b["admission_steps"], b["finish_step"], b["max_new_tokens"]) == ("length", "1", 4, 4)
    if not overlap:  # plain loop: the row of step 0 is written after A's result was processed
        assert (steps["available_size"].iloc[0], steps["evictable_size"].iloc[0]) == (39, 1)


@pytest.mark.parametrize("overlap", [False, True])
def test_too_long_prompt_with_output_room_rides_a_decode_step_under_overlap(overlap):
    """C: 35 tokens >= 34, max_new_tokens min(4, 39 - 35 - 1, 40 - 35 - 1 - 1) = 3. Plain loop: one
    1-token prefill, then the abort. Overlap: step 1 is planned before the prefill's result lands and C
    does not finish by length in flight (0 + 1 < 3), so it decodes once more (one slot) before the abort
    lands, like an EOS finish; that slot was committed, so 2 tokens are cached instead of 1."""
    trace = [TraceReq(0, 0.0, prompt(1, 35), 4)]
    steps, reqs, sched = run_sim(trace, cfg(40, overlap))
    assert steps["kind"].tolist() == (["extend", "decode"] if overlap else ["extend"])
    assert (reqs["max_new_tokens"].iloc[0], reqs["output_len"].iloc[0]) == (3, 1)
    assert reqs["finished_reason"].tolist() == ["abort"]
    assert sched.tree_cache.evictable_size() == (2 if overlap else 1)
    assert sched.allocator.available_size() == 40 - sched.tree_cache.evictable_size()


def test_ignore_eos_without_radix_cache_admits_by_simulating_finishes():
    """``add_one_req_ignore_eos``: pool 40, A (10 tokens, 20 outputs) prefills at step 0; B (10 tokens,
    5 outputs) arrives during it. Both ignore_eos, so the running A reserves its whole remainder (ratio 1).

    Step 1, radix cache disabled: avail 30 (A holds its 10 prompt slots), rem_total = 30 - (20 - 1) = 11.
    B's gate: paged input 10 + page 1 = 11 <= min(cur_rem 30, rem_total 11). Replay, shortest remaining
    first: states [(B: 5 left, 10 held), (A: 19 left, 11 held)], cur_rem = 30 - 11 = 19;
    i=0, bs=2: 19 - 5 x 2 = 9 > 1 x 2; i=1, bs=1: 19 + 10 (B freed) - 19 = 10 > 1 -> admitted.
    B prefills at step 1 and decodes with A in steps 2-5 (peak 14 + 14 slots), finishing at step 5;
    A finishes at step 20. The normal reservation (radix cache on) needs 10 + 5 + 1 = 16 < 11: NO_TOKEN,
    batch_is_full until A leaves after step 19, so B is admitted at step 20 and finishes at step 24."""
    trace = [TraceReq(0, 0.0, prompt(1, 10), 20), TraceReq(1, 0.005, prompt(100, 10), 5)]
    steps, reqs, _ = run_sim(trace, cfg(40), disable_radix_cache=True, ignore_eos=True)
    assert steps["kind"].tolist() == ["extend", "extend"] + ["decode"] * 19
    assert reqs["admission_steps"].tolist() == ["0", "1"]
    assert reqs["finish_step"].tolist() == [20, 5]
    assert steps["batch_size"].tolist()[2:6] == [2, 2, 2, 2]
    assert steps["retracted"].sum() == 0
    normal, nreqs, _ = run_sim(trace, cfg(40), ignore_eos=True)
    assert nreqs["admission_steps"].tolist() == ["0", "20"]
    assert nreqs["finish_step"].tolist() == [19, 24]


def test_ignore_eos_chunk_is_the_whole_chunk_budget_unaligned():
    """Page 4, chunked_prefill_size 10, radix cache disabled, ignore_eos; A: 25 tokens, 3 outputs. The gate:
    ceil_page(25) + 4 = 32 <= 128; replay: 128 - 32 - 3 > 1. 25 > 10, so A is chunked, and this path cuts at
    the chunk budget itself, 10, not at a page boundary (the normal path would cut at 8). The continuing
    chunks take min(10, rem_total) = 10, then the last 5; two decodes follow."""
    trace = [TraceReq(0, 0.0, prompt(1, 25), 3)]
    steps, reqs, _ = run_sim(trace, cfg(128, chunk=10, page=4), disable_radix_cache=True, ignore_eos=True)
    assert steps["prefill_tokens"].tolist() == [10, 10, 5, 0, 0]
    assert reqs["output_len"].tolist() == [3]
    normal, _, _ = run_sim(trace, cfg(128, chunk=10, page=4), disable_radix_cache=True)
    assert normal["prefill_tokens"].tolist()[0] == 8


def test_ignore_eos_insertion_follows_sglangs_loop():
    """A later candidate is inserted before the first state it does not exceed; SGLang's loop variable stays
    on the last index when none is larger, so the largest goes before the last entry, not after it."""
    from types import SimpleNamespace

    from poolsim.sim.prefill_adder import PrefillAdder

    adder = PrefillAdder.__new__(PrefillAdder)
    adder.new_token_ratio = 0.5
    adder.req_states = [(5, 1), (9, 1)]
    def req(left):
        return SimpleNamespace(ignore_eos=True, max_new_tokens=left, num_output=0, origin_input_len=1)
    adder._add_req_state(req(7), insert_sort=True)
    assert [s[0] for s in adder.req_states] == [5, 7, 9]
    adder._add_req_state(req(12), insert_sort=True)
    assert [s[0] for s in adder.req_states] == [5, 7, 12, 9]
    # not ignore_eos: max_new_tokens x new_token_ratio - outputs; nothing left: no state
    adder._add_req_state(SimpleNamespace(ignore_eos=False, max_new_tokens=8, num_output=4, origin_input_len=1),
                         insert_sort=True)
    assert [s[0] for s in adder.req_states] == [5, 7, 12, 9]


def test_max_new_tokens_is_clipped_to_memory():
    # 30-token prompt in a 40-token pool: min(requested 20, 39 - 30 - 1 = 8, 40 - 30 - 1 - 1 = 8) = 8
    trace = [TraceReq(0, 0.0, prompt(1, 30), 20)]
    _, reqs, _ = run_sim(trace, cfg(40))
    assert reqs["max_new_tokens"].tolist() == [8] and reqs["output_len"].tolist() == [8]


def test_eos_finish_rides_one_extra_step_under_overlap():
    """Output stops by EOS at 3 tokens while max_new_tokens is 10. The overlap loop cannot know: it plans
    a 4th decode step (one more slot) before the 3rd token's result lands; the plain loop does not.
    A length finish is known in advance (next_output_finishes_by_length) and costs no extra step."""
    eos = [TraceReq(0, 0.0, prompt(1, 5), 3, max_new_tokens=10)]
    plain, _, s1 = run_sim(eos, cfg(64, overlap=False))
    over, _, s2 = run_sim(eos, cfg(64, overlap=True))
    assert len(plain) == 3 and len(over) == 4
    # overlap: the extra step's KV (token 8) was committed, so 5 + 3 = 8 tokens are cached, not 7
    assert s1.tree_cache.evictable_size() == 7 and s2.tree_cache.evictable_size() == 8
    length = [TraceReq(0, 0.0, prompt(1, 5), 3)]
    over_len, _, _ = run_sim(length, cfg(64, overlap=True))
    assert len(over_len) == 3


def test_determinism_same_csv_bytes():
    trace = [TraceReq(i, 0.001 * i, prompt(1 + (i % 3) * 50, 12), 5 + i % 4) for i in range(12)]
    a = run_sim(trace, cfg(60, overlap=True))
    b = run_sim(trace, cfg(60, overlap=True))
    assert a[0].to_csv(index=False) == b[0].to_csv(index=False)
    assert a[1].to_csv(index=False) == b[1].to_csv(index=False)


def test_extra_buffer_decode_checkpoint_counts_when_its_result_lands():
    """extra_buffer, overlap, page 1, chunk and track grid 64. A: 127-token prompt, 10 outputs.

    Step 0 prefills 127 tokens: the prefill checkpoint is at 127 // 64 x 64 = 64. Step 1 is planned before
    step 0's result lands; its decode makes the sequence 128, on the track grid, so the forward writes a state
    for 128, but SGLang counts that checkpoint only when step 1's result is processed
    (``_handle_finish_state_updated_req``). Step 0's result lands first and checkpoints A's prompt with the
    newest counted state, 64: the tree holds 64 tokens locked by A (protected 64 in the rows of steps 1-9,
    written after each previous step's result). A finishes at step 9 (1 + 9 outputs) with 136 tokens and
    donates its 128 state: nodes [0, 64) and [64, 128), each with a state. B (arriving at 1 s: A's prompt
    plus one token) matches 127 tokens, splitting the second node at 127, where there is no state: it
    reuses 64 tokens. Recording the decode's checkpoint at allocation instead gave 128 locked tokens and a
    single stateful node at 128, so B reused nothing."""
    from poolsim.pools import MambaCacheParams, MambaStateShape
    from poolsim.sim.server import MambaConfig

    params = MambaCacheParams(shape=MambaStateShape.kimi_linear(tp=1, num_heads=2, head_dim=4), layers=[0, 1])
    mamba = MambaConfig(max_mamba_cache_size=8, cache_params=params, strategy="extra_buffer",
                        ping_pong_track_buffer_size=2, mamba_track_interval=64)
    a_prompt = prompt(1, 127)
    trace = [TraceReq(0, 0.0, a_prompt, 10), TraceReq(1, 1.0, a_prompt + [7], 3)]
    steps, reqs, _ = run_sim(trace, cfg(1024, overlap=True, chunk=None, rows=2, ctx=2048), mamba=mamba)
    assert steps["protected_size"].tolist()[:10] == [0] + [64] * 9
    assert reqs["finish_step"].tolist()[0] == 9
    assert reqs["cached_tokens"].tolist() == ["0", "64"]


def test_step_rows_are_written_after_the_result_and_keep_the_after_scheduling_values():
    """Plain loop, pool 16. A (6 tokens, 4 outputs): prefill at step 0, decodes 1-3, each taking one slot.
    B (2 tokens) arrives at 0.035 s, during step 3. Step 3 is scheduled with A running, nobody waiting and
    16 - 6 - 3 = 7 free slots; its row is written after its result: A finished (row freed, its 9 KV tokens
    now evictable in the tree, still not free) and B queued during the forward."""
    trace = [TraceReq(0, 0.0, prompt(1, 6), 4), TraceReq(1, 0.035, prompt(100, 2), 1)]
    steps, _, _ = run_sim(trace, cfg(16))
    row = steps.iloc[3]
    assert (row["running_scheduled"], row["waiting_scheduled"], row["available_size_scheduled"]) == (1, 0, 7)
    assert (row["running"], row["waiting"], row["available_size"], row["evictable_size"]) == (0, 1, 7, 9)


def test_what_the_step_time_model_and_the_replay_read_of_decode_rows():
    """enable_mixed_chunk: A (6-token prompt, 4 outputs) at 0, B (5-token prompt, 3 outputs) at 0.015.

    A decode row's length is its committed KV after this step's slot: prompt + outputs so far.
    Step 0 extends A. Step 1 decodes A: 6 + 1 = 7. Step 2 extends B mixed with A's decode: 8.
    Step 3 decodes B (5 + 1 = 6) and A (9, its 4th and last token), in that order: a mixed batch lists its
    extend rows first and stays the running batch. Step 4 decodes B alone: 7.
    The batch carries the count and the sum (what the model reads); the replay reads the lengths off the
    rows at launch (kernels.replay.launch_seq_lens) and must see the same ones."""
    from poolsim.kernels.replay import StepShape, launch_seq_lens
    from poolsim.sim.engine import Simulation
    from poolsim.sim.metrics import Recorder
    from poolsim.sim.server import build_server

    seen, launched = [], []

    def step_time(batch):
        launched.append(batch.copy())
        shape = StepShape.of(batch)
        seen.append((batch.forward_mode, batch.num_decode_reqs if batch.forward_mode != "extend" else None,
                     batch.decode_seq_lens_sum if batch.forward_mode != "extend" else None,
                     launch_seq_lens(batch), shape.decode_seq_lens_sum, shape.num_decode_reqs))
        return STEP

    rec = Recorder()
    sched = build_server(cfg(64, enable_mixed_chunk=True), recorder=rec)
    trace = [TraceReq(0, 0.0, prompt(1, 6), 4), TraceReq(1, 0.015, prompt(100, 5), 3)]
    Simulation([sched], step_time, rec, max_new_tokens_for=lambda t: (t.max_new_tokens or t.output_len, False),
               check_every_step=True).run(trace)
    assert seen == [
        ("extend", None, None, [], 0, 0),
        ("decode", 1, 7, [7], 7, 1),
        ("mixed", 1, 8, [8], 8, 1),
        ("decode", 2, 15, [6, 9], 15, 2),
        ("decode", 1, 7, [7], 7, 1),
    ]
    # read after the run, step 1's row (A, since grown to 9) no longer holds the launch length: refused
    with pytest.raises(RuntimeError, match="sum to 9, but prepare_for_decode summed 7"):
        launch_seq_lens(launched[1])
