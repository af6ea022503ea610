"""The SWA side of the unified tree (``unified_cache/components/swa.py``), hand-derived slot for slot.

Every scenario: full pool 32 slots, SWA pool 16, page 1 (free lists start 1..size, alloc from the head,
free appends), sliding window 4 (one page-aligned window = 4 tokens; the LRU refresh walks window + page = 5).
"""

import numpy as np
import pytest

from poolsim.pools import ReqToTokenPool
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    match_prefix_for_req,
    release_kv_cache,
)
from poolsim.pools.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from poolsim.pools.mem_cache.radix_cache import RadixKey
from poolsim.pools.mem_cache.swa_radix_cache import SWARadixCache
from tests.helpers import FakeReq, as_list


def make():
    pool = ReqToTokenPool(4, 64)
    alloc = SWATokenToKVPoolAllocator(32, 16, 1)
    return SWARadixCache(pool, alloc, sliding_window_size=4), pool, alloc


def admit(tree, pool, req, extend_end=None):
    match_prefix_for_req(req, tree)
    req.lock = tree.lock(req.last_node)
    req.extend_end = req.seqlen if extend_end is None else extend_end
    return alloc_for_extend([req], tree, pool)


def finish(tree, req):
    req.done = True
    release_kv_cache(req, tree, checkpoint=True)


def path(tree, tokens):
    """Nodes from the root along ``tokens`` (which must end on a node boundary)."""
    node, pos, out = tree.root_node, 0, []
    while pos < len(tokens):
        node = node.children[int(tokens[pos])]
        out.append(node)
        pos += len(node.key)
    return out


def swa(node):
    return None if node.swa_value is None else as_list(node.swa_value)


def assert_both_conserved(tree, reqs=()):
    """Each pool: available + the tree's evictable + protected + what live requests own == its size."""
    alloc, pool = tree.token_to_kv_pool_allocator, tree.req_to_token_pool
    full_owned = swa_owned = 0
    for r in reqs:
        if r.kv.req_pool_idx is not None:
            row = np.asarray(pool.req_to_token[r.kv.req_pool_idx, r.kv.cache_protected_len:r.kv.kv_allocated_len])
            full_owned += len(row)
            swa_owned += int((alloc.full_to_swa_index_mapping[row] > 0).sum())
    assert alloc.full_available_size() + tree.evictable_size() + tree.protected_size() + full_owned == 32
    assert alloc.swa_available_size() + tree.swa_evictable_size() + tree.swa_protected_size() + swa_owned == 16
    tree.check_integrity()
    alloc.check_integrity()


def test_finished_request_caps_its_leaf_at_one_window_and_swa_eviction_tombstones_the_older_part():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 11))
    admit(tree, pool, a)  # full slots 1..10, SWA peers 1..10
    finish(tree, a)
    # the 10-token leaf is split so that the leaf is one window (7..10); both parts get SWA data
    p, n = path(tree, list(range(1, 11)))
    assert (len(p.key), len(n.key)) == (6, 4)
    assert swa(p) == [1, 2, 3, 4, 5, 6] and swa(n) == [7, 8, 9, 10]
    assert [x.id for x in tree.swa_lru.lru_to_mru()] == [p.id, n.id]  # the parent was published first
    assert (tree.swa_evictable_size(), alloc.swa_available_size()) == (10, 6)
    assert_both_conserved(tree)

    # B (10 unrelated tokens) needs 10 SWA slots, 6 are free: the SWA shortfall 4 tombstones the LRU node,
    # the internal 1..6, whole (6 >= 4); the full pool had room, so no leaf goes
    b = FakeReq(range(20, 30))
    admit(tree, pool, b)
    assert swa(p) is None and swa(n) == [7, 8, 9, 10] and tree.evictable_size() == 10
    assert as_list(alloc.full_to_swa_index_mapping[1:11]) == [0] * 6 + [7, 8, 9, 10]
    # SWA free list was [11..16] and got 1..6 appended: B's peers
    assert as_list(alloc.full_to_swa_index_mapping[11:21]) == [11, 12, 13, 14, 15, 16, 1, 2, 3, 4]
    assert_both_conserved(tree, [b])

    # a match may end at 10: the last window (7..10) still has SWA, the tombstone above does not matter
    c = FakeReq(list(range(1, 11)) + [99])
    assert match_prefix_for_req(c, tree).prefix_len == 10 and c.last_node is n
    # ending at 8 (inside the leaf) leaves only 7..8 of SWA in the last window: no valid prefix at all
    d = FakeReq(list(range(1, 9)) + [98, 97])
    r = match_prefix_for_req(d, tree)
    assert (r.prefix_len, r.full_kv_hit_length, d.last_node) == (0, 8, tree.root_node)
    assert_both_conserved(tree, [b])


def test_window_lock_covers_the_last_window_only_and_its_uuid_moves_with_a_split():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 11))
    admit(tree, pool, a)
    finish(tree, a)
    p, n = path(tree, list(range(1, 11)))
    tree.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8, 98]))  # splits the leaf: 7..8 | 9..10
    p, na, n = path(tree, list(range(1, 11)))
    assert (swa(na), swa(n)) == ([7, 8], [9, 10])

    lock = tree.lock(n)  # FULL: the whole path; SWA: 9..10 and 7..8 (4 tokens), not 1..6
    assert (n.swa_lock_ref, na.swa_lock_ref, p.swa_lock_ref) == (1, 1, 0)
    assert na.swa_uuid is not None and lock[1] == na.swa_uuid
    assert (tree.swa_protected_size(), tree.swa_evictable_size(), tree.protected_size()) == (4, 6, 10)
    # an SWA shortfall can only take the unlocked 1..6 (a tombstone: its child keeps the KV path)
    assert tree.evict_for_pools(0, 16) == 0
    assert (swa(p), swa(na), swa(n)) == (None, [7, 8], [9, 10])

    tree.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 55]))  # splits 7..8 while locked: the uuid moves up
    p, q, na, n = path(tree, list(range(1, 11)))
    assert (len(q.key), q.swa_lock_ref, q.swa_uuid, na.swa_uuid) == (1, 1, lock[1], None)
    tree.unlock(lock)  # the release stops at the node holding the uuid
    assert (n.swa_lock_ref, na.swa_lock_ref, q.swa_lock_ref, p.swa_lock_ref) == (0, 0, 0, 0)
    assert (tree.swa_protected_size(), tree.swa_evictable_size(), tree.protected_size()) == (0, 4, 0)
    assert_both_conserved(tree)


def test_decode_window_release_then_insert_tombstones_below_it_and_eviction_order():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 17), origin_input_len=6)
    admit(tree, pool, a, extend_end=6)  # slots 1..6
    for _ in range(6):
        alloc_for_decode([a], tree, pool)  # slots 7..12, kv_committed_len 12
    # the decode of position 12 (seqlen 12, pre_len 11): free below 11 - 4 = 7, i.e. SWA of rows 0..6
    tree.evict_sliding_window(a, 11)
    assert a.kv.swa_evicted_seqlen == 7
    assert as_list(alloc.full_to_swa_index_mapping[1:13]) == [0] * 7 + [8, 9, 10, 11, 12]
    assert as_list(alloc.swa_attn_allocator.free_pages) == [13, 14, 15, 16, 1, 2, 3, 4, 5, 6, 7]
    tree.evict_sliding_window(a, 11)  # nothing new has left the window: no-op
    assert a.kv.swa_evicted_seqlen == 7
    assert_both_conserved(tree, [a])

    a.tokens = a.tokens[:12]
    finish(tree, a)
    # the insert keeps 1..7 as a tombstone, and caps the live 8..12 at one window: 8 | 9..12
    t, q, leaf = path(tree, list(range(1, 13)))
    assert [len(x.key) for x in (t, q, leaf)] == [7, 1, 4]
    assert (swa(t), swa(q), swa(leaf)) == (None, [8], [9, 10, 11, 12])
    assert (tree.evictable_size(), tree.swa_evictable_size()) == (12, 5)
    assert_both_conserved(tree)

    # SWA shortfall 5 (the pool is 11 free, target 16): SWA LRU first q (internal: tombstone, 1 freed),
    # then the leaf (deleted with its full KV: 4 more)
    assert tree.evict_for_pools(0, 5) == 4
    assert as_list(alloc.swa_attn_allocator.free_pages) == [13, 14, 15, 16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    # a full shortfall then takes the tombstone leaves by LRU, full slots only: 8, then 1..7
    assert tree.evict_for_pools(8, 0) == 8
    assert as_list(alloc.full_attn_allocator.free_pages) == list(range(13, 33)) + [9, 10, 11, 12, 8] + list(range(1, 8))
    assert (tree.evictable_size(), tree.swa_evictable_size()) == (0, 0)
    assert_both_conserved(tree)


def test_chunked_prefill_frees_out_of_window_swa_before_each_stash():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 13))
    admit(tree, pool, a, extend_end=8)  # first chunk: slots 1..8
    checkpoint_kv_cache(a, tree)  # stash: key ends at 8, pre_len 7: SWA of rows 0..2 goes (7 - 4 = 3)
    assert a.kv.swa_evicted_seqlen == 3 and a.kv.cache_protected_len == 8
    t, q, leaf = path(tree, list(range(1, 9)))
    assert (swa(t), swa(q), swa(leaf)) == (None, [4], [5, 6, 7, 8])
    assert leaf.swa_lock_ref == 1 and q.swa_lock_ref == 0  # the request's lock: its last window only
    assert_both_conserved(tree, [a])
    a.extend_end = 12
    alloc_for_extend([a], tree, pool)  # second chunk: full 9..12, SWA 9..12
    finish(tree, a)
    nodes = path(tree, list(range(1, 13)))
    assert [swa(x) for x in nodes] == [None, [4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert (tree.swa_evictable_size(), alloc.swa_available_size()) == (9, 7)
    assert_both_conserved(tree)


def test_insert_over_a_tombstone_inside_the_window_adopts_the_new_slots():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 11))
    admit(tree, pool, a)
    finish(tree, a)
    tree.evict_for_pools(0, 1)  # tombstones 1..6 (LRU): SWA free list [11..16, 1..6]
    p = path(tree, list(range(1, 7)))[0]
    assert swa(p) is None
    e = FakeReq(list(range(1, 7)) + [40, 41, 42, 43])
    assert admit(tree, pool, e) is not None and e.prefix_len == 0  # 1..6 is a tombstone: no valid match
    assert as_list(pool.req_to_token[e.kv.req_pool_idx, :10]) == list(range(11, 21))
    # E's full-KV hit (6) went past its valid prefix (0): its checkpoint stops at that branching point. 1..6 lies
    # in E's live window (nothing evicted), so the unlocked tombstone takes E's slots 11..16 and their SWA peers;
    # its old full slots 1..6 go back (full side only). E's own 40..43 are not cached: slots 17..20 (and their
    # SWA peers 1..4) are freed with its row.
    assert e.swa_branching_seqlen == 6
    finish(tree, e)
    assert as_list(p.value) == [11, 12, 13, 14, 15, 16] and swa(p) == [11, 12, 13, 14, 15, 16]
    assert as_list(alloc.full_attn_allocator.free_pages) == list(range(21, 33)) + [1, 2, 3, 4, 5, 6, 17, 18, 19, 20]
    assert as_list(alloc.swa_attn_allocator.free_pages) == [5, 6, 1, 2, 3, 4]
    assert list(p.children) == [7] and e.swa_branching_seqlen is None
    assert (tree.evictable_size(), tree.swa_evictable_size()) == (10, 10)
    f = FakeReq(list(range(1, 7)) + [40, 41, 42, 43, 44])
    assert match_prefix_for_req(f, tree).prefix_len == 6  # 1..6 holds a whole window of SWA again
    assert_both_conserved(tree)


def test_insert_over_a_locked_tombstone_keeps_the_full_slots_and_takes_the_swa_peers():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 11))
    admit(tree, pool, a)
    finish(tree, a)
    tree.evict_for_pools(0, 1)  # tombstone 1..6
    p = path(tree, list(range(1, 7)))[0]
    hold = tree.lock(p)  # a FULL lock on 1..6 (its SWA lock covers a tombstone: nothing protected)
    e = FakeReq(list(range(1, 7)) + [40, 41, 42, 43])
    admit(tree, pool, e)  # slots 11..20, SWA peers 11..16, 1..4
    finish(tree, e)  # inserts up to its branching point 6 (as above)
    # the locked node keeps full slots 1..6 and gets E's SWA peers 11..16; E's full 11..16 go back, then the
    # rest of its row (17..20) with its row
    assert as_list(p.value) == [1, 2, 3, 4, 5, 6] and swa(p) == [11, 12, 13, 14, 15, 16]
    assert as_list(alloc.full_to_swa_index_mapping[1:7]) == [11, 12, 13, 14, 15, 16]
    assert as_list(alloc.full_to_swa_index_mapping[11:17]) == [0] * 6
    assert as_list(alloc.full_attn_allocator.free_pages) == list(range(21, 33)) + [11, 12, 13, 14, 15, 16,
                                                                                   17, 18, 19, 20]
    assert tree.swa_protected_size() == 6  # it was published under the SWA lock
    tree.unlock(hold)
    assert (tree.swa_protected_size(), tree.swa_evictable_size()) == (0, 10)
    assert_both_conserved(tree)


def test_retract_frees_the_rows_below_the_window_on_the_full_side_only():
    tree, pool, alloc = make()
    a = FakeReq(range(1, 17), origin_input_len=6)
    admit(tree, pool, a, extend_end=6)
    for _ in range(6):
        alloc_for_decode([a], tree, pool)
    tree.evict_sliding_window(a, 11)  # SWA of rows 0..6 gone
    release_kv_cache(a, tree, checkpoint=False)
    assert alloc.full_available_size() == 32 and alloc.swa_available_size() == 16
    assert as_list(alloc.full_attn_allocator.free_pages) == list(range(13, 33)) + list(range(1, 13))
    assert as_list(alloc.swa_attn_allocator.free_pages) == [13, 14, 15, 16] + list(range(1, 13))
    assert a.kv.swa_evicted_seqlen == 0
    assert_both_conserved(tree)


def test_swa_radix_cache_needs_the_swa_allocator_and_a_window():
    from poolsim.pools import TokenToKVPoolAllocator

    with pytest.raises(PoolError, match="SWATokenToKVPoolAllocator"):
        SWARadixCache(ReqToTokenPool(2, 8), TokenToKVPoolAllocator(8), sliding_window_size=4)
    with pytest.raises(PoolError, match="positive sliding_window_size"):
        SWARadixCache(ReqToTokenPool(2, 8), SWATokenToKVPoolAllocator(8, 8, 1), sliding_window_size=0)
