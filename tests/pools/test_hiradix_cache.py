"""HiRadixCache: the radix cache with SGLang 0.5.23's host tier, driven through the request lifecycle with expected
numbers derived by hand from unified_radix_cache.py / unified_tree_core.py (the arithmetic is in the comments).

Every scenario: a 40-token device pool at page size 1 (FIFO free list, docs/sglang.md 2.2), slots handed out
from 1; a host pool with an exact capacity (host slots from 0, freed ones appended only when the free ones run out).
A = a 16-token prompt, B = A + 12 more tokens, C = 30 unrelated tokens."""

from poolsim.pools import ReqToTokenPool, TokenToKVPoolAllocator
from poolsim.pools.mem_cache.allocation import alloc_for_extend, match_prefix_for_req, release_kv_cache
from poolsim.pools.mem_cache.hiradix_cache import HiRadixCache
from poolsim.pools.mem_cache.pool_host.base import HostKVCache
from tests.helpers import FakeReq, as_list, assert_conserved

A = list(range(1, 17))
B = A + list(range(101, 113))
C = list(range(500, 530))


def make_tree(policy, host_tokens=64, size=40, bandwidth=float("inf"), size_per_token=1):
    pool = ReqToTokenPool(4, 64)
    alloc = TokenToKVPoolAllocator(size)
    host = HostKVCache(size_per_token, size, 0.0, 0, 1, host_token_capacity=host_tokens)
    return HiRadixCache(pool, alloc, host, policy, bandwidth=bandwidth), pool, alloc


def serve(tree, pool, tokens, now=0.0):
    """Match, admit (loading a host hit back when there is one), prefill, finish: one request end to end."""
    r = FakeReq(tokens)
    match_prefix_for_req(r, tree)
    lock = tree.lock(r.last_node)
    if r.host_hit_length:
        loaded = tree.init_load_back(r)
        r.prefix_len += loaded
        r.kv.cache_protected_len = r.prefix_len
    r.lock = tree.lock(r.last_node)
    tree.unlock(lock)
    r.extend_end = r.seqlen
    out = alloc_for_extend([r], tree, pool)
    r.done = True
    release_kv_cache(r, tree, checkpoint=True)
    tree.check_hicache_events(now)  # the next scheduler iteration
    return r, out


def node_at(tree, tokens):
    node, pos = tree.root_node, 0
    while pos < len(tokens):
        node = node.children[tokens[pos]]
        pos += len(node.key)
    return node


def where(node):
    return ("D" if node.value is not None else "") + ("H" if node.host_value is not None else "")


def test_write_through_backs_up_at_insert_and_keeps_a_host_copy_on_eviction():
    tree, pool, alloc = make_tree("write_through")
    r = FakeReq(A)
    match_prefix_for_req(r, tree)
    r.lock = tree.lock(r.last_node)
    r.extend_end = 16
    assert as_list(alloc_for_extend([r], tree, pool)) == list(range(1, 17))
    r.done = True
    release_kv_cache(r, tree, checkpoint=True)
    a = node_at(tree, A)
    # the new leaf's hit count 1 reaches write_through's threshold 1: host slots 0..15 taken at once, the node
    # locked until the copy's ack: all 16 tokens protected, none evictable
    assert (where(a), a.hit_count, as_list(a.host_value)) == ("DH", 1, list(range(16)))
    assert (tree.evictable_size(), tree.protected_size(), a.pending_ack) == (0, 16, a.id)
    tree.check_hicache_events(0.0)  # next iteration: the copy is acked, the lock released
    assert (tree.evictable_size(), tree.protected_size(), a.pending_ack) == (0 + 16, 0, None)
    assert_conserved(tree, [], 40)

    serve(tree, pool, B)
    b = node_at(tree, B)
    # B walks A (hit 2; already on host) and adds a 12-token leaf, written through to host slots 16..27
    assert (a.hit_count, b.hit_count, where(b), as_list(b.host_value)) == (2, 1, "DH", list(range(16, 28)))
    assert tree.host_used_size() == 28 and alloc.available_size() == 12

    # C needs 30 of 12 free: evict 18. The LRU device leaf is B's (12): demoted; then A, now a device leaf
    # (its child is host-only): demoted. Both keep their host copies; the device slots go back FIFO:
    # C gets 29..40, then B's 17..28, then A's 1..6.
    _, out = serve(tree, pool, C)
    assert as_list(out) == list(range(29, 41)) + list(range(17, 29)) + list(range(1, 7))
    assert (where(a), where(b)) == ("H", "H")
    assert tree.evictable_host_leaves == {b}  # A has a child: not a host leaf
    assert (tree.num_demoted_tokens, tree.num_dropped_tokens) == (28, 0)
    assert tree.host_used_size() == 28 + 30  # C written through to host 28..57
    assert_conserved(tree, [], 40)


def test_load_back_of_a_host_hit_and_of_one_spanning_device_and_host():
    tree, pool, alloc = make_tree("write_through")
    for tokens in (A, B, C):
        serve(tree, pool, tokens)
    a, b, c = node_at(tree, A), node_at(tree, B), node_at(tree, C)
    # E = A + 4: matched against 19 tokens (len - 1): A's node, host-only: device prefix 0, host hit 16 >= 10
    e = FakeReq(A + [901, 902, 903, 904])
    res = match_prefix_for_req(e, tree)
    assert (res.prefix_len, e.host_hit_length, e.best_match_node) == (0, 16, a)
    lock = tree.lock(e.last_node)
    # 16 device slots needed, 40 - 30 = 10 free: evict 6 -> C's leaf (host copy kept) is demoted whole;
    # the free list then reads 7..16 (never used), C's 29..40, 17..28, 1..6: A is loaded into 7..16, 29..34
    assert tree.init_load_back(e) == 16
    assert (e.last_node, where(a), where(c)) == (a, "DH", "H")
    assert as_list(a.value) == list(range(7, 17)) + list(range(29, 35))
    assert tree.protected_size() == 16  # locked by the ongoing load until its ack
    tree.unlock(lock)
    # D = B + 2: A on device (16), then B host-only (12 >= 10): the load spans device and host nodes
    d = FakeReq(B + [801, 802])
    res = match_prefix_for_req(d, tree)
    assert (res.prefix_len, d.host_hit_length, d.best_match_node) == (16, 12, b)
    assert tree.init_load_back(d) == 12
    assert as_list(b.value) == list(range(35, 41)) + list(range(17, 23))
    assert as_list(tree.path_device_indices(b)) == as_list(a.value) + as_list(b.value)
    tree.check_hicache_events(0.0)  # the loads' acks come with the forward they serve, not before
    assert tree.protected_size() == 28
    tree.ready_to_load_host_cache()  # the batch starts loading
    tree.hicache.on_launch(0.0, 1.0)
    tree.check_hicache_events(1.0)
    assert tree.protected_size() == 0 and tree.evictable_size() == 28
    assert_conserved(tree, [], 40)


def test_a_host_hit_under_the_threshold_is_recomputed_and_adopts_the_fresh_slots():
    tree, pool, alloc = make_tree("write_through")
    short = A[:8]
    for tokens in (short, list(range(500, 536))):  # 36 > 40 - 8: the 8-token prompt is demoted for them
        serve(tree, pool, tokens)
    s = node_at(tree, short)
    assert where(s) == "H"
    r = FakeReq(short + [7001, 7002, 7003])
    match_prefix_for_req(r, tree)
    assert r.host_hit_length == 8 and tree.init_load_back(r) == 0  # 8 < load_back_threshold 10
    assert tree.num_recomputed_host_tokens == 8
    r.lock = tree.lock(r.last_node)
    r.extend_end = r.seqlen
    out = alloc_for_extend([r], tree, pool)
    r.done = True
    release_kv_cache(r, tree, checkpoint=True)
    # the insert meets the host-only node and gives it the request's freshly computed slots (no duplicate freed)
    assert where(s) == "DH" and as_list(s.value) == as_list(out)[:8]
    assert_conserved(tree, [], 40)


def test_write_through_selective_backs_up_on_the_second_hit():
    tree, pool, alloc = make_tree("write_through_selective")
    serve(tree, pool, A)
    a = node_at(tree, A)
    assert (where(a), a.hit_count) == ("D", 1)  # threshold 2: not yet
    serve(tree, pool, B)
    b = node_at(tree, B)
    # B's insert walks A (hit 2: backed up to host 0..15) and adds its own leaf (hit 1: device only)
    assert (where(a), a.hit_count, as_list(a.host_value)) == ("DH", 2, list(range(16)))
    assert (where(b), b.hit_count) == ("D", 1)
    # eviction: B's leaf has no host copy and is deleted; A keeps its host copy
    serve(tree, pool, C)
    assert B[16] not in a.children and where(a) == "H"
    assert (tree.num_demoted_tokens, tree.num_dropped_tokens) == (16, 12)
    assert_conserved(tree, [], 40)


def test_selective_counts_a_prefill_checkpoint_and_the_finish_as_one_hit_per_node():
    """A request's own inserts count a node once: the finish walks past cache_inserted_len only."""
    from poolsim.pools.mem_cache.allocation import checkpoint_kv_cache

    tree, pool, alloc = make_tree("write_through_selective")
    r = FakeReq(A + [201, 202, 203], origin_input_len=16)
    match_prefix_for_req(r, tree)
    r.lock = tree.lock(r.last_node)
    r.extend_end = 19
    alloc_for_extend([r], tree, pool)
    r.extend_end = 16
    checkpoint_kv_cache(r, tree)  # after prefill: inserts the prompt, hit 1
    r.done = True
    release_kv_cache(r, tree, checkpoint=True)  # inserts 19 with inserted_len 16: the prompt node is not counted
    a = node_at(tree, A)
    assert (a.hit_count, where(a)) == (1, "D")
    assert node_at(tree, A + [201, 202, 203]).hit_count == 1


def test_write_back_copies_on_device_eviction_only():
    tree, pool, alloc = make_tree("write_back")
    serve(tree, pool, A)
    serve(tree, pool, B)
    a, b = node_at(tree, A), node_at(tree, B)
    assert (where(a), where(b), a.hit_count, tree.host_used_size()) == ("D", "D", 0, 0)  # no hits counted
    # eviction reaches B first: written to host 0..11 (and waited for), then demoted; then A: host 12..27
    serve(tree, pool, C)
    assert (where(a), where(b)) == ("H", "H")
    assert (as_list(b.host_value), as_list(a.host_value)) == (list(range(12)), list(range(12, 28)))
    assert tree.protected_size() == 0 and not tree.ongoing_write_through  # write_back takes no lock
    assert tree.hicache.total_written == 28
    assert_conserved(tree, [], 40)


def test_write_back_reclaims_host_duplicates_before_host_leaves():
    tree, pool, alloc = make_tree("write_back", host_tokens=32)
    serve(tree, pool, A)
    serve(tree, pool, C)  # 16 + 30 > 40: A written back to host 0..15 and demoted
    a = node_at(tree, A)
    e = FakeReq(A + [901])
    match_prefix_for_req(e, tree)
    # 16 device slots, 10 free: C must go, but its write-back needs 30 host slots of the 16 free, and the only
    # host copy (A's) is pinned by this load: C is dropped with no copy
    assert tree.init_load_back(e) == 16 and tree.num_dropped_tokens == 30
    tree.ready_to_load_host_cache()
    tree.hicache.on_launch(0.0, 1.0)
    tree.check_hicache_events(1.0)  # the load's ack: A is now on both tiers, a duplicate
    assert where(a) == "DH" and list(tree.full_host_duplicates) == [a.id]
    # a host request of 16 slots: the duplicate's host copy goes first (its device copy stays)
    assert tree.evict_host(16) == 16 and where(a) == "D"
    assert_conserved(tree, [], 40)


def test_host_eviction_takes_lru_host_leaves_then_their_parents():
    # host pool of 40: A (16) and B's leaf (12) fill 28; X (12 unrelated) would need 12 of 12 left: fits;
    # then Y (12) needs 12 with 0 free: host eviction, LRU host leaves first
    tree, pool, alloc = make_tree("write_through", host_tokens=40, size=64)
    X = list(range(600, 612))
    Y = list(range(700, 712))
    for tokens in (A, B, X):
        serve(tree, pool, tokens)
    a, b, x = node_at(tree, A), node_at(tree, B), node_at(tree, X)
    tree.evict(64)  # everything demoted: all host-only
    assert {where(n) for n in (a, b, x)} == {"H"}
    assert tree.evictable_host_leaves == {b, x}
    match_prefix_for_req(FakeReq(X + [1]), tree)  # X touched: B's leaf is now the LRU host leaf
    serve(tree, pool, Y)  # Y's write-through needs 12 host slots: B's leaf (12) is evicted for them
    assert B[16] not in a.children and tree.evictable_host_leaves == {a, x}  # A is a host leaf now
    assert as_list(node_at(tree, Y).host_value) == list(range(16, 28))  # B's released slots, reused
    # a request for 20 more: A (LRU, 16) then X (12): whole nodes, 28 freed
    assert tree.evict_host(20) == 28
    assert tree.evictable_host_leaves == set() and tree.host_used_size() == 12
    assert_conserved(tree, [], 64)


def test_acks_wait_for_the_copy_and_the_write_fence():
    # 1 B a token at 16 B/s: A's 16-token copy takes 1 s, after the forward pass running when it is submitted
    tree, pool, alloc = make_tree("write_through", bandwidth=16.0)
    tree.hicache.on_launch(0.0, 2.0)  # a forward runs until t=2: the copy starts then
    serve(tree, pool, A, now=0.5)
    a = node_at(tree, A)
    assert a.pending_ack == a.id and tree.protected_size() == 16
    tree.check_hicache_events(2.5)
    assert a.pending_ack == a.id  # 2 + 1 = 3 s
    tree.check_hicache_events(3.0)
    assert a.pending_ack is None and tree.protected_size() == 0


def test_backup_skipped_when_the_host_pool_cannot_hold_it():
    tree, pool, alloc = make_tree("write_through", host_tokens=8)
    serve(tree, pool, A)  # 16 > 8 host slots and nothing to evict on host: skipped silently
    a = node_at(tree, A)
    assert where(a) == "D" and tree.num_backup_skipped_tokens == 16 and tree.protected_size() == 0
    serve(tree, pool, C)  # evicting A now drops it: no host copy
    assert A[0] not in tree.root_node.children and tree.num_dropped_tokens == 16
    assert_conserved(tree, [], 40)
