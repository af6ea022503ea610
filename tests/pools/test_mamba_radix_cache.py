"""The mamba side of the unified tree (docs/sglang.md 7.5), hand-derived scenarios."""

import pytest

from poolsim.pools import HybridReqToTokenPool, MambaCacheParams, MambaStateShape, TokenToKVPoolAllocator
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    match_prefix_for_req,
    release_kv_cache,
)
from poolsim.pools.mem_cache.mamba_radix_cache import MambaRadixCache
from poolsim.pools.mem_cache.no_cache import DisabledRadixCache
from tests.helpers import FakeReq, as_list, assert_conserved

PARAMS = MambaCacheParams(shape=MambaStateShape.kimi_linear(tp=1, num_heads=2, head_dim=4), layers=[0, 1])


def make(kv_size, mamba_size, strategy="no_buffer", rows=4, ctx=512):
    pool = HybridReqToTokenPool(rows, ctx, mamba_size, PARAMS,
                                mamba_ping_pong_track_buffer_size=2 if strategy == "extra_buffer" else 0)
    alloc = TokenToKVPoolAllocator(kv_size)
    return MambaRadixCache(pool, alloc, strategy=strategy), pool, alloc


def held_slots(reqs):
    n = 0
    for r in reqs:
        n += r.kv.mamba_pool_idx is not None
        n += sum(s >= 0 for s in (r.kv.mamba_ping_pong_track_buffer or []))
    return n


def assert_mamba_conserved(tree, reqs, mamba_size):
    got = (tree.mamba_allocator.available_size() + tree.mamba_evictable_size() + tree.mamba_protected_size()
           + held_slots(reqs))
    assert got == mamba_size
    tree.check_integrity()
    tree.mamba_allocator.check_integrity()


def admit(tree, pool, req, extend_end=None):
    match_prefix_for_req(req, tree)
    req.lock = tree.lock(req.last_node)
    req.extend_end = req.seqlen if extend_end is None else extend_end
    return alloc_for_extend([req], tree, pool)


def test_no_buffer_states_hits_cow_and_eviction():
    tree, pool, alloc = make(64, 4)
    a = FakeReq(list(range(1, 13)), origin_input_len=10)  # 10 prompt + 2 decoded
    admit(tree, pool, a, extend_end=10)
    assert a.kv.mamba_pool_idx == 1 and a.kv.req_pool_idx == 4
    alloc_for_decode([a], tree, pool)
    alloc_for_decode([a], tree, pool)
    a.done = True
    release_kv_cache(a, tree, checkpoint=True)
    # the finished request's own slot 1 is handed to the tree (no copy), at the end of its 12 tokens
    assert (tree.mamba_evictable_size(), tree.evictable_size()) == (1, 12)
    assert as_list(tree.mamba_allocator.free_slots) == [2, 3, 4]
    assert_mamba_conserved(tree, [], 4)

    # B continues A's conversation: the match ends on A's state-bearing node; the state is
    # copied into B's own new slot 2 (copy-on-write), B locks that node.
    b = FakeReq(list(range(1, 13)) + [50, 51])
    res = match_prefix_for_req(b, tree)
    assert res.prefix_len == 12 and b.kv.mamba_pool_idx == 2 and b.kv.mamba_cow_src_index == 1
    b.lock = tree.lock(b.last_node)
    assert (tree.mamba_evictable_size(), tree.mamba_protected_size()) == (0, 1)
    b.extend_end = 14
    assert as_list(alloc_for_extend([b], tree, pool)) == [13, 14]
    assert b.kv.mamba_pool_idx == 2 and b.kv.req_pool_idx == 4  # keeps its slot; row 4 came back first
    assert_mamba_conserved(tree, [b], 4)

    # C shares 11 tokens with A: the FULL walk splits A's node at 11, but no state sits there,
    # so the usable match is 0 (full_kv_hit_length 11) and C computes all 14 tokens.
    c = FakeReq(list(range(1, 12)) + [60, 61, 62])
    res = match_prefix_for_req(c, tree)
    assert (res.prefix_len, res.full_kv_hit_length, res.mamba_branching_seqlen) == (0, 11, None)
    c.lock = tree.lock(c.last_node)
    c.extend_end = 14
    assert as_list(alloc_for_extend([c], tree, pool)) == list(range(15, 29))
    assert c.kv.mamba_pool_idx == 3
    c.done = True
    release_kv_cache(c, tree, checkpoint=True)
    # the insert finds A's first 11 tokens cached: C's copies (slots 15..25) are duplicates
    assert as_list(alloc.free_pages)[-11:] == list(range(15, 26))
    assert as_list(tree.mamba_allocator.free_slots) == [4]
    assert_mamba_conserved(tree, [b], 4)

    # two new requests need 2 slots, 1 is free: the mamba LRU walk skips A's node (B holds its
    # mamba lock) and deletes C's leaf (KV 26..28 and state 3 go back).
    d, e = FakeReq([900, 901]), FakeReq([910, 911])
    for r in (d, e):
        r.prefix_len, r.extend_end = 0, 2
    assert as_list(alloc_for_extend([d, e], tree, pool)) == [29, 30, 31, 32]
    assert (d.kv.mamba_pool_idx, e.kv.mamba_pool_idx) == (4, 3)
    # the eviction ran before the token allocation: C's KV 26..28 queued after its duplicates
    assert as_list(alloc.free_pages)[-14:] == list(range(15, 29))
    assert (tree.evictable_size(), tree.protected_size()) == (0, 12)
    assert (tree.mamba_evictable_size(), tree.mamba_protected_size()) == (0, 1)
    assert_mamba_conserved(tree, [b, d, e], 4)
    assert_conserved(tree, [b, d, e], 64)


def test_retraction_frees_state_slots_without_inserting():
    tree, pool, alloc = make(64, 4)
    a = FakeReq(list(range(1, 9)))
    admit(tree, pool, a)
    release_kv_cache(a, tree, checkpoint=False)
    assert tree.mamba_evictable_size() == 0 and tree.mamba_allocator.available_size() == 4
    assert tree.evictable_size() == 0 and alloc.available_size() == 64


def test_exact_repeat_gets_no_hit_without_an_interior_state():
    """no_buffer states sit only at sequence ends; the len-1 cap stops one token short of them."""
    tree, pool, alloc = make(64, 4)
    a = FakeReq(list(range(1, 9)))
    admit(tree, pool, a)
    a.done = True
    release_kv_cache(a, tree, checkpoint=True)
    again = FakeReq(list(range(1, 9)))
    assert match_prefix_for_req(again, tree).prefix_len == 0


def test_extra_buffer_tracks_checkpoints_and_donates_the_latest():
    tree, pool, alloc = make(1024, 8, strategy="extra_buffer", ctx=1024)
    assert (tree.mamba_checkpoint_grid, tree.mamba_track_grid) == (64, 256)
    a = FakeReq(list(range(1, 261)), origin_input_len=150)
    admit(tree, pool, a, extend_end=150)
    # working slot 1 and ping-pong slots 2, 3
    assert a.kv.mamba_pool_idx == 1 and a.kv.mamba_ping_pong_track_buffer == [2, 3]
    tree.track_after_extend(a, 0, 150)  # 150 >= 64: checkpoint at 2 x 64 = 128 into position 0
    assert (a.kv.mamba_last_track_idx, a.kv.mamba_next_track_idx, a.kv.mamba_last_track_seqlen) == (0, 1, 128)
    for _ in range(110):  # committed 151 .. 260; 256 is on the track grid
        alloc_for_decode([a], tree, pool)
        if (track := tree.track_after_decode(a)) is not None:
            tree.commit_decode_track(a, track)  # the decode's result lands
    assert (a.kv.mamba_last_track_idx, a.kv.mamba_last_track_seqlen, a.kv.mamba_prev_track_seqlen) == (1, 256, 128)
    a.done = True
    release_kv_cache(a, tree, checkpoint=True)
    # donated: position 1 (slot 3) at depth 256; the 4 KV slots past it are freed with the row;
    # the working slot 1 and the other ping-pong slot 2 go back to the free list
    assert tree.evictable_size() == 256 and tree.mamba_evictable_size() == 1
    assert as_list(alloc.free_pages)[-4:] == [257, 258, 259, 260]
    assert as_list(tree.mamba_allocator.free_slots) == [4, 5, 6, 7, 8, 1, 2]
    assert_mamba_conserved(tree, [], 8)

    b = FakeReq(list(range(1, 261)) + list(range(700, 720)))
    res = match_prefix_for_req(b, tree)
    assert res.prefix_len == 256 and b.kv.mamba_pool_idx == 4 and b.kv.mamba_cow_src_index == 3


def test_extra_buffer_chunk_checkpoint_donates_and_replaces_the_slot():
    tree, pool, alloc = make(1024, 8, strategy="extra_buffer", ctx=1024)
    r = FakeReq(list(range(1, 301)))
    admit(tree, pool, r, extend_end=200)
    tree.track_after_extend(r, 0, 200)  # checkpoint at 192 in position 0 (slot 2)
    tree.checkpoint(r, up_to=200)  # inserts 192 tokens, donates slot 2, position 0 gets a new slot 4
    assert tree.evictable_size() + tree.protected_size() == 192
    assert r.kv.mamba_ping_pong_track_buffer == [4, 3] and r.kv.mamba_last_track_seqlen is None
    assert r.kv.cache_protected_len == 192 and tree.mamba_protected_size() == 1
    assert_mamba_conserved(tree, [r], 8)


def test_no_buffer_needs_page_size_one():
    pool = HybridReqToTokenPool(4, 64, 4, PARAMS)
    from poolsim.pools import PagedTokenToKVPoolAllocator

    with pytest.raises(PoolError):
        MambaRadixCache(pool, PagedTokenToKVPoolAllocator(64, 4), strategy="no_buffer")


def test_disabled_cache_frees_everything_and_matches_nothing():
    pool = HybridReqToTokenPool(4, 64, 4, PARAMS)
    alloc = TokenToKVPoolAllocator(64)
    tree = DisabledRadixCache(pool, alloc)
    a = FakeReq(list(range(1, 9)))
    admit(tree, pool, a)
    assert a.prefix_len == 0 and a.kv.mamba_pool_idx == 1
    a.done = True
    release_kv_cache(a, tree, checkpoint=True)
    assert alloc.available_size() == 64 and pool.mamba_allocator.available_size() == 4
    b = FakeReq(list(range(1, 9)))
    assert match_prefix_for_req(b, tree).prefix_len == 0



def test_evict_mamba_skips_locked_states_and_keeps_lru_order_across_locks():
    """The mamba LRU by hand: states inserted A, B, C, D (oldest first), A locked. A match touches B, so the
    order is A, C, D, B: the first eviction skips locked A and takes C (not B, the oldest insert). A is then
    unlocked (after a second lock, and a relock without a touch): it keeps its place at the head and goes next,
    before D and B."""
    import numpy as np

    from poolsim.pools.mem_cache.radix_cache import RadixKey

    tree, pool, alloc = make(64, 4)
    nodes = []
    for key in ([1, 2], [3, 4], [5, 6], [7, 8]):
        slot = int(tree.mamba_allocator.alloc(1)[0])
        nodes.append(tree.insert(RadixKey(key), alloc.alloc(2), mamba_value=slot).last_node)
    a, b, c, d = nodes
    assert [n.mamba_value for n in nodes] == [1, 2, 3, 4]

    tree.inc_lock_ref(a)
    tree.inc_lock_ref(a)
    tree.dec_lock_ref(a)  # still locked once
    assert tree.match_prefix(RadixKey([3, 4])).prefix_len == 2
    assert list(tree.mamba_lru.values()) == [a, c, d, b]
    assert tree.evict_mamba(1) == 1
    assert c.mamba_value is None and list(tree.mamba_lru.values()) == [a, d, b]
    assert 5 not in tree.root_node.children  # C was a leaf: deleted with its KV

    tree.dec_lock_ref(a)
    tree.inc_lock_ref(a)  # lock and unlock again without a touch: A's place in the LRU does not change
    tree.dec_lock_ref(a)
    assert tree.mamba_evictable_size() == 3
    assert tree.evict_mamba(2) == 2
    assert list(tree.mamba_lru.values()) == [b]
    assert tree.evict_mamba(5) == 1  # only B is left
    assert not tree.mamba_lru and not tree.root_node.children
    assert as_list(tree.mamba_allocator.free_slots) == [3, 1, 4, 2]
    assert np.array_equal(np.sort(alloc.free_pages), np.arange(1, 65))
    tree.check_integrity()
