"""Waiting-queue order (docs/sglang.md 0.1 and schedule_policy.py): fcfs keeps arrival order, lpm sorts by
cached prefix, defers a request whose prefix another waiting request brings, and falls back to fcfs past 128."""

import random

import pytest

from poolsim.pools import RadixCache, RadixKey, ReqToTokenPool, TokenToKVPoolAllocator
from poolsim.sim.req import Req
from poolsim.sim.schedule_policy import SchedulePolicy
from tests.helpers import TraceReq, tree_state


def tree_with(tokens):
    tree = RadixCache(ReqToTokenPool(4, 256), TokenToKVPoolAllocator(512))
    n = len(tokens)
    tree.insert(RadixKey(tokens), tree.token_to_kv_pool_allocator.alloc(n))
    return tree


def req(rid, prompt):
    return Req(rid, TraceReq(rid, 0.0, prompt, 4), max_new_tokens=4)


CACHED = list(range(1, 101))  # a 100-token prompt already in the tree


def test_lpm_sorts_by_cached_prefix_and_defers_in_batch_duplicates():
    tree = tree_with(CACHED)
    fresh = [500 + i for i in range(40)]
    a = req(0, list(range(900, 950)))  # nothing cached
    b = req(1, CACHED[:60] + [7] * 10)  # 60 cached
    c = req(2, fresh + [1, 2])  # 0 cached; first to bring `fresh`
    d = req(3, fresh + [3, 4])  # 0 cached; shares 40 >= 32 tokens with c's -> deferred
    e = req(4, CACHED + [8])  # 100 cached (the uncapped calc_priority match), capped to 100 of 101
    queue = [a, b, c, d, e]
    SchedulePolicy("lpm", tree).calc_priority(queue)
    assert [r.rid for r in queue] == [4, 1, 0, 2, 3]
    assert [r.num_matched_prefix_tokens for r in (e, b, a)] == [100, 60, 0]


def test_lpm_falls_back_to_fcfs_past_128_waiting():
    tree = tree_with(CACHED)
    queue = [req(i, [1000 + i, 1]) for i in range(128)] + [req(128, CACHED + [5])]
    SchedulePolicy("lpm", tree).calc_priority(queue)
    assert queue[-1].rid == 128  # 129 waiting: no matching, no sorting
    queue = queue[1:]
    SchedulePolicy("lpm", tree).calc_priority(queue)
    assert queue[0].rid == 128  # 128 waiting: sorted


def test_fcfs_keeps_order_and_refreshes_waiting_prefixes_every_32nd_pass():
    tree = tree_with(CACHED)
    alloc = tree.token_to_kv_pool_allocator
    tree.insert(RadixKey([300, 301, 302]), alloc.alloc(3))  # newer than CACHED
    queue = [req(0, CACHED + [9]), req(1, [42, 43])]
    policy = SchedulePolicy("fcfs", tree)
    policy.calc_priority(queue)  # pass 0 refreshes: CACHED's leaf is now the most recent
    assert [r.rid for r in queue] == [0, 1]
    assert tree.evict(1) == 3  # so [300..302] is the LRU leaf
    for _ in range(31):
        policy.calc_priority(queue)  # passes 1..31 do not refresh
    tree.insert(RadixKey([400, 401]), alloc.alloc(2))
    policy.calc_priority(queue)  # pass 32 refreshes again
    assert tree.evict(1) == 2


def test_disabled_cache_turns_lpm_into_fcfs():
    from poolsim.pools import DisabledRadixCache

    pool, alloc = ReqToTokenPool(4, 64), TokenToKVPoolAllocator(64)
    assert SchedulePolicy("lpm", DisabledRadixCache(pool, alloc)).policy == "fcfs"


def test_token_ids_past_the_prompt_are_prompt_then_outputs_and_read_only():
    """Req.token_ids(n) = origin_input_ids + output_ids[:n - len(prompt)], however the cached ids grew."""
    r = req(3, [7, 8, 9])
    assert r.token_ids(2).tolist() == [7, 8]
    assert r.token_ids(5).tolist() == [7, 8, 9, -3_000_001, -3_000_002]
    assert r.token_ids(40)[-1] == -3_000_037 and len(r.token_ids(40)) == 40  # past the first 32 cached outputs
    assert r.token_ids(4).tolist() == [7, 8, 9, -3_000_001]
    assert not r.token_ids(5).flags.writeable
    r.drop_token_cache()
    assert r.token_ids(5).tolist() == [7, 8, 9, -3_000_001, -3_000_002]


@pytest.mark.parametrize("seed", range(4))
def test_waiting_refresh_with_carried_hints_equals_whole_matches_from_the_root(seed):
    """``_touch_waiting_prefixes`` (hints kept per waiting request, dropped when its seqlen changes) against
    ``_touch_waiting_prefixes_reference`` over random queues (arrivals, admissions, readmissions at the front
    with more tokens, more than 128 waiting) and trees that change between refreshes (inserts, some of a waiting
    request's own longer key, evictions): the same tree after every refresh."""
    rng = random.Random(seed)
    bases = [[rng.randrange(1, 5) for _ in range(24)] for _ in range(4)]
    prompts = [rng.choice(bases)[: rng.randint(0, 24)] + [rng.randrange(1, 5) for _ in range(rng.randint(1, 16))]
               for _ in range(200)]
    worlds = []
    for _ in range(2):
        tree = RadixCache(ReqToTokenPool(4, 256), TokenToKVPoolAllocator(600))
        worlds.append((tree, SchedulePolicy("fcfs", tree), [req(i, p) for i, p in enumerate(prompts)], []))
    refreshes, calls = 0, 0
    for _ in range(32 * 60):
        op, i, n = rng.random(), rng.randrange(len(prompts)), rng.randint(1, 40)
        for w, (tree, policy, reqs, queue) in enumerate(worlds):
            alloc = tree.token_to_kv_pool_allocator
            if op < 0.3:
                queue.append(reqs[i])  # an arrival (a request may wait twice: the refresh does not mind)
            elif op < 0.4 and queue:
                queue.pop(i % len(queue))  # admitted
            elif op < 0.5 and queue:
                r = queue.pop(i % len(queue))
                r.num_output += n % 3  # retracted with outputs: back at the front, longer
                queue.insert(0, r)
            elif op < 0.65:
                r = queue[i % len(queue)] if queue and n % 2 else reqs[i]
                key = r.token_ids(r.seqlen)
                if alloc.available_size() < len(key):
                    tree.evict(len(key))
                if alloc.available_size() >= len(key):
                    tree.insert(RadixKey(key), alloc.alloc(len(key)))
            elif op < 0.7:
                tree.evict(n)
            if w == 0:
                policy.calc_priority(queue)
            else:
                policy._touch_waiting_prefixes_reference(queue)
        if worlds[0][1]._refresh_calls != calls and calls % 32 == 0:  # a refresh pass just ran
            refreshes += 1
            assert tree_state(worlds[0][0]) == tree_state(worlds[1][0]), refreshes
        calls = worlds[0][1]._refresh_calls
    assert refreshes >= 40 and tree_state(worlds[0][0]) == tree_state(worlds[1][0])
