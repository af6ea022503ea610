"""RadixCache and the request lifecycle, with expected numbers derived by hand from docs/sglang.md
sections 4, 5 and 10 (the arithmetic is in the comments)."""

import numpy as np
import pytest

from poolsim.pools import PagedTokenToKVPoolAllocator, ReqToTokenPool, TokenToKVPoolAllocator
from poolsim.pools.errors import OutOfMemoryError
from poolsim.pools.mem_cache.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    match_prefix_for_req,
    release_kv_cache,
)
from poolsim.pools.mem_cache.radix_cache import RadixCache, RadixKey
from tests.helpers import FakeReq, as_list, assert_conserved

SYS = list(range(1, 13))  # a 12-token system prompt
A_PROMPT = SYS + [101, 102, 103, 104]  # 16 tokens
A_OUT = [201, 202, 203]


def make_tree(size, page_size, rows=4):
    pool = ReqToTokenPool(rows, 64)
    alloc = TokenToKVPoolAllocator(size) if page_size == 1 else PagedTokenToKVPoolAllocator(size, page_size)
    return RadixCache(pool, alloc), pool, alloc


def admit(tree, pool, req, extend_end=None):
    match_prefix_for_req(req, tree)
    req.lock = tree.lock(req.last_node)
    req.extend_end = req.seqlen if extend_end is None else extend_end
    return alloc_for_extend([req], tree, pool)


def finish(tree, req):
    req.done = True
    release_kv_cache(req, tree, checkpoint=True)


# ---------------------------------------------------------------- docs/sglang.md section 10, page 1
def test_spec_scenario_page1():
    tree, pool, alloc = make_tree(48, 1)
    live = []
    # A: 16-token prompt -> slots 1..16; three decode steps -> 17, 18, 19.
    a = FakeReq(A_PROMPT + A_OUT, origin_input_len=16)
    out = admit(tree, pool, a, extend_end=16)
    assert as_list(out) == list(range(1, 17)) and a.kv.req_pool_idx == 4  # rows are LIFO from the tail
    for _ in range(3):
        alloc_for_decode([a], tree, pool)
    assert as_list(pool.req_to_token[4, :19]) == list(range(1, 20))
    finish(tree, a)
    # inserts 19 tokens; the prompt re-insert splits the leaf at 16 (prompt 16 + output 3)
    assert tree.evictable_size() == 19 and tree.protected_size() == 0
    assert alloc.available_size() == 29
    assert [len(n.key) for n in tree.root_node.children.values()] == [16]
    assert_conserved(tree, live, 48)

    # B shares 14 tokens: the 16-token node splits at 14; locking B protects 14, 5 stay evictable.
    b = FakeReq(SYS + [101, 102, 901, 902, 903])
    res = match_prefix_for_req(b, tree)
    assert res.prefix_len == 14 and as_list(res.device_indices) == list(range(1, 15))
    b.lock = tree.lock(b.last_node)
    assert (tree.evictable_size(), tree.protected_size()) == (5, 14)
    b.extend_end = 17
    assert as_list(alloc_for_extend([b], tree, pool)) == [20, 21, 22]
    live.append(b)
    assert_conserved(tree, live, 48)

    # C is A's finished sequence: the len-1 cap matches 18, not 19 (the 3-token leaf splits at 2).
    c = FakeReq(A_PROMPT + A_OUT)
    res = match_prefix_for_req(c, tree)
    assert res.prefix_len == 18
    c.lock = tree.lock(c.last_node)
    assert (tree.evictable_size(), tree.protected_size()) == (1, 18)
    c.extend_end = 19
    assert as_list(alloc_for_extend([c], tree, pool)) == [23]  # one recomputed token
    live.append(c)
    assert_conserved(tree, live, 48)
    live.remove(c)
    finish(tree, c)  # slot 23 is a duplicate of the tree's slot 19 and is freed by the insert
    assert alloc.available_size() == 26
    assert as_list(alloc.free_pages)[-1] == 23
    assert (tree.evictable_size(), tree.protected_size()) == (5, 14)
    assert_conserved(tree, live, 48)

    # D (31 unrelated tokens): shortfall 31 - 26 = 5 evicts exactly the 5 tokens A and C alone held,
    # leaf by leaf (1, then 2, then 2), appending their slots to the free list.
    d = FakeReq(list(range(500, 531)))
    out = admit(tree, pool, d)
    assert as_list(out) == list(range(24, 49)) + [23, 19, 17, 18, 15, 16]
    assert alloc.available_size() == 0
    assert (tree.evictable_size(), tree.protected_size()) == (0, 14)
    live.append(d)
    assert_conserved(tree, live, 48)


# ---------------------------------------------------------------- the same at page 4
def test_spec_scenario_page4():
    tree, pool, alloc = make_tree(48, 4)  # pages 1..12
    live = []
    a = FakeReq(A_PROMPT + A_OUT, origin_input_len=16)
    assert as_list(admit(tree, pool, a, extend_end=16)) == list(range(4, 20))  # pages 1-4
    for _ in range(3):
        alloc_for_decode([a], tree, pool)  # 17 % 4 == 1 -> new page 5: slots 20, 21, 22
    assert as_list(pool.req_to_token[4, 16:19]) == [20, 21, 22]
    assert alloc.available_size() == 28
    finish(tree, a)
    # the key is page-aligned to 16; the unaligned tail (3 tokens on page 5) is freed: +4 slots
    assert tree.evictable_size() == 16 and alloc.available_size() == 32
    assert as_list(alloc.free_pages)[0] == 5  # prepended: reused first
    assert_conserved(tree, live, 48)

    b = FakeReq(SYS + [101, 102, 901, 902, 903])
    res = match_prefix_for_req(b, tree)
    assert res.prefix_len == 12  # 14 common tokens, rounded down to the page
    b.lock = tree.lock(b.last_node)
    b.extend_end = 17
    # prefix ends on a page boundary: new pages 5, 6 for positions 12..16
    assert as_list(alloc_for_extend([b], tree, pool)) == [20, 21, 22, 23, 24]
    live.append(b)
    assert (tree.evictable_size(), tree.protected_size()) == (4, 12)
    assert_conserved(tree, live, 48)

    c = FakeReq(A_PROMPT + A_OUT)
    res = match_prefix_for_req(c, tree)
    assert res.prefix_len == 16  # cap 18, aligned to 16
    c.lock = tree.lock(c.last_node)
    c.extend_end = 19
    assert as_list(alloc_for_extend([c], tree, pool)) == [28, 29, 30]  # page 7
    live.append(c)
    assert_conserved(tree, live, 48)
    live.remove(c)
    finish(tree, c)  # key aligns to 16, all already cached; tail page 7 returns
    assert alloc.available_size() == 24 and as_list(alloc.free_pages)[0] == 7

    # B finishes: its 17 tokens align to 16; tokens 12..15 differ from A's within the page, so B's page
    # becomes a new 4-token leaf next to A/C's; B's 17th token (page 6) is freed. Tree: 12 -> {4, 4}.
    live.remove(b)
    finish(tree, b)
    assert (tree.evictable_size(), tree.protected_size(), alloc.available_size()) == (20, 0, 28)
    assert_conserved(tree, live, 48)

    # D (30 unrelated tokens): conservative demand 30 + 1 x 4 = 34, shortfall 34 - 28 = 6. LRU: A/C's
    # 4-token leaf first (C touched it before B's leaf was made), then B's: whole nodes go, 8 tokens
    # for a shortfall of 6 (docs/sglang.md section 10).
    d = FakeReq(list(range(500, 530)))
    out = admit(tree, pool, d)
    assert tree.num_evicted_tokens == 8
    assert (tree.evictable_size(), tree.protected_size()) == (12, 0)
    assert as_list(out[:8]) == [20, 21, 22, 23, 16, 17, 18, 19]  # B's page 5, then A/C's page 4: prepended
    live.append(d)
    assert_conserved(tree, live, 48)


# ---------------------------------------------------------------- chunked prefill checkpoints
def test_chunked_checkpoints_free_duplicates_and_reanchor():
    tree, pool, alloc = make_tree(32, 1)
    prompt = list(range(1, 21))
    r = FakeReq(prompt + [301, 302], origin_input_len=20)
    # chunk 1: [0, 8) -> slots 1..8, published as an 8-token leaf, R's lock moves onto it
    out = admit(tree, pool, r, extend_end=8)
    assert as_list(out) == list(range(1, 9))
    checkpoint_kv_cache(r, tree)
    assert (r.prefix_len, r.kv.cache_protected_len) == (8, 8)
    assert (tree.evictable_size(), tree.protected_size()) == (0, 8)
    assert_conserved(tree, [r], 32)

    # Q has the same first 16 tokens; it matches R's published 8, computes 8..15 and finishes first.
    q = FakeReq(prompt[:16])
    assert as_list(admit(tree, pool, q)) == list(range(9, 17))
    assert q.prefix_len == 8
    finish(tree, q)
    assert (tree.evictable_size(), tree.protected_size()) == (8, 8)

    # chunk 2 of R: [8, 16) -> slots 17..24. Its checkpoint finds Q's node: 17..24 are duplicates,
    # freed; R's row now points at Q's slots 9..16 and its lock moves to Q's node.
    r.extend_end = 16
    assert as_list(alloc_for_extend([r], tree, pool)) == list(range(17, 25))
    checkpoint_kv_cache(r, tree)
    assert as_list(pool.req_to_token[r.kv.req_pool_idx, :16]) == list(range(1, 17))
    assert r.kv.cache_protected_len == 16
    assert (tree.evictable_size(), tree.protected_size()) == (0, 16)
    assert as_list(alloc.free_pages) == list(range(25, 33)) + list(range(17, 25))
    assert_conserved(tree, [r], 32)

    # last chunk [16, 20) and two decode steps, then finish
    r.extend_end = 20
    assert as_list(alloc_for_extend([r], tree, pool)) == [25, 26, 27, 28]
    alloc_for_decode([r], tree, pool)
    alloc_for_decode([r], tree, pool)
    finish(tree, r)
    # inserts 22 tokens: a new 6-token leaf, split by the prompt re-insert into 4 + 2
    assert (tree.evictable_size(), tree.protected_size()) == (22, 0)
    assert as_list(alloc.free_pages) == [31, 32] + list(range(17, 25))
    assert_conserved(tree, [], 32)


# ---------------------------------------------------------------- retraction, overshoot, OOM
def test_retraction_inserts_nothing_and_frees_what_it_owns():
    tree, pool, alloc = make_tree(16, 1)
    a = FakeReq(list(range(1, 9)))
    admit(tree, pool, a)
    finish(tree, a)  # 8 cached tokens
    b = FakeReq(list(range(1, 9)) + [50, 51])
    admit(tree, pool, b)  # matches 8, allocates 2
    alloc_for_decode([b], tree, pool)
    assert (tree.evictable_size(), tree.protected_size(), alloc.available_size()) == (0, 8, 5)
    release_kv_cache(b, tree, checkpoint=False)
    # nothing inserted: the 3 owned slots return, the prefix lock is dropped, the tree is unchanged
    assert (tree.evictable_size(), tree.protected_size(), alloc.available_size()) == (8, 0, 8)
    assert b.kv.req_pool_idx is None and b.lock is None
    assert_conserved(tree, [], 16)


def test_eviction_frees_whole_nodes_and_may_overshoot():
    tree, pool, alloc = make_tree(16, 1)
    a = FakeReq(list(range(1, 11)))  # a 10-token leaf
    admit(tree, pool, a)
    finish(tree, a)
    assert tree.evict(3) == 10  # one node, whole: 10 >= 3
    assert alloc.available_size() == 16 and tree.evictable_size() == 0


def test_lru_order_and_parents_become_candidates():
    tree, pool, alloc = make_tree(64, 1)
    for toks in ([1, 2, 3, 4, 10, 11], [1, 2, 3, 4, 20, 21, 22], [30, 31, 32]):
        r = FakeReq(toks)
        admit(tree, pool, r)
        finish(tree, r)
    # tree: [1..4] -> {[10,11], [20,21,22]}, [30..32]. Touch the first branch again.
    tree.match_prefix(RadixKey([1, 2, 3, 4, 10, 11]))
    # LRU leaf is [20,21,22] (inserted before the match), then [30..32]; evicting 4 takes both
    assert tree.evict(4) == 6
    assert sorted(len(n.key) for n in tree.root_node.children.values()) == [4]
    # now [10, 11] is the only leaf; after it goes, its parent [1..4] becomes a candidate
    assert tree.evict(5) == 6
    assert tree.root_node.children == {} and tree.evictable_size() == 0


def test_allocation_that_cannot_fit_is_a_typed_oom():
    tree, pool, alloc = make_tree(8, 1)
    r = FakeReq(list(range(1, 11)))
    with pytest.raises(OutOfMemoryError):
        admit(tree, pool, r)


def test_extra_keys_never_share_nodes():
    tree, pool, alloc = make_tree(32, 1)
    a = FakeReq([1, 2, 3, 4, 5], extra_key="lora-a")
    admit(tree, pool, a)
    finish(tree, a)
    assert tree.match_prefix(RadixKey([1, 2, 3, 4, 5], "lora-b")).prefix_len == 0
    assert tree.match_prefix(RadixKey([1, 2, 3, 4, 5])).prefix_len == 0
    assert tree.match_prefix(RadixKey([1, 2, 3, 4, 5], "lora-a")).prefix_len == 5


def test_bare_match_of_a_fully_cached_key_matches_all_of_it():
    tree, pool, alloc = make_tree(32, 1)
    a = FakeReq([7, 8, 9])
    admit(tree, pool, a)
    finish(tree, a)
    assert tree.match_prefix(RadixKey([7, 8, 9])).prefix_len == 3  # the len-1 cap is the caller's


def test_insert_returns_cached_length_and_keeps_existing_values():
    tree, pool, alloc = make_tree(32, 1)
    first = tree.insert(RadixKey([1, 2, 3]), np.array([5, 6, 7]))
    assert first.prefix_len == 0
    alloc.alloc(7)  # hold slots 1..7 so the duplicate free below is legal
    again = tree.insert(RadixKey([1, 2, 3, 4]), np.array([1, 2, 3, 4]))
    assert again.prefix_len == 3
    assert as_list(tree.match_prefix(RadixKey([1, 2, 3, 4])).device_indices) == [5, 6, 7, 4]
    assert as_list(alloc.free_pages)[-3:] == [1, 2, 3]  # the caller's copies of [1, 2, 3] were freed


@pytest.mark.parametrize("page_size", [1, 4])
def test_insert_from_the_locked_node_equals_the_walk_from_the_root(page_size):
    """A chunk checkpoint resumes below the node the previous one locked: same nodes, recency stamps, clock
    and freed slots as the full walk (here the locked node was split by another insert in between)."""
    def run(use_hint):
        tree, pool, alloc = make_tree(64, page_size)
        tokens = np.arange(1, 33, dtype=np.int64)
        slots = np.asarray(alloc.alloc(16))
        node = tree.insert(RadixKey(tokens[:16]), slots).last_node
        tree.lock(node)
        tree.insert(RadixKey(np.concatenate([tokens[:8], [900] * 8])), alloc.alloc(16))  # splits the path
        tree.insert(RadixKey(tokens[16:24]), alloc.alloc(8))  # an unrelated branch
        ours = np.asarray(alloc.alloc(16))  # the request's slots for [16, 32)
        res = tree.insert(RadixKey(tokens), np.concatenate([slots, ours]), prev_prefix_len=16,
                          from_node=node if use_hint else None)
        nodes, stack = [], [tree.root_node]
        while stack:
            n = stack.pop()
            nodes.append((n.id, n.parent.id if n.parent else -1, n.lock_ref, n.last_access_time,
                          as_list(n.key), as_list(n.value)))
            stack.extend(sorted(n.children.values(), key=lambda c: c.id))
        return res.prefix_len, res.last_node.id, tree._clock, sorted(nodes), as_list(alloc.free_pages)

    assert run(True) == run(False)


def test_touch_prefix_replays_a_valid_hint_and_rewalks_a_changed_path():
    """The waiting-queue refresh's ``touch_prefix``: stamps by hand from the logical clock (a new node takes
    two ticks, an insert one for the root and one per node walked, a match one)."""
    tree, pool, alloc = make_tree(64, 1)
    key = lambda toks: (lambda: RadixKey(toks))  # noqa: E731
    tree.insert(RadixKey(list(range(1, 9))), np.asarray(alloc.alloc(8)))  # root t=2, node A [1..8] t=3; clock 5
    a = tree.root_node.children[1]
    hint = tree.touch_prefix(key(list(range(1, 11))))  # walks A, misses on token 9: A t=5, clock 6
    assert (a.last_access_time, tree.root_node.last_access_time, tree._clock) == (5, 5 - 1e-5, 6)
    assert tree.touch_prefix(key(None), hint) is hint  # nothing changed: replayed, the key never built
    assert (a.last_access_time, tree._clock) == (6, 7)
    # B [9, 10] under A: the lookup that missed now hits, so the walk runs again (root 7, A 8, B 9..10).
    tree.insert(RadixKey(list(range(1, 11))), np.concatenate([a.value, alloc.alloc(2)]), prev_prefix_len=8)
    b = a.children[9]
    hint2 = tree.touch_prefix(key(list(range(1, 11))), hint)
    assert hint2 is not hint and hint2[0] == [a, b]
    assert (b.last_access_time, a.last_access_time, tree._clock) == (11, 11 - 1e-5, 12)
    # [1, 2, 3, 4, 50] splits A at 4 (root 12, A 13, new parent N 14..15, A 16, leaf 17..18): re-walked.
    tree.insert(RadixKey([1, 2, 3, 4, 50]), np.concatenate([a.value[:4], alloc.alloc(1)]), prev_prefix_len=4)
    n = tree.root_node.children[1]
    hint3 = tree.touch_prefix(key(list(range(1, 11))), hint2)
    assert hint3[0] == [n, a, b] and tree._clock == 20
    assert [x.last_access_time for x in (b, a, n)] == [19, 19 - 1e-5, 19 - 2e-5]
    # Evicting B (the LRU leaf is [50], t=17, then B): the hint's last node is gone, the walk ends on A.
    assert tree.evict(3) == 3 and 9 not in a.children
    hint4 = tree.touch_prefix(key(list(range(1, 11))), hint3)
    assert hint4[0] == [n, a] and hint4[2] == 9 and a.last_access_time == 20


def _tree_nodes(tree) -> list:
    """Every node as (id, parent id, LRU stamp, key, slots), sorted: two trees built alike compare equal."""
    nodes, stack = [], [tree.root_node]
    while stack:
        n = stack.pop()
        nodes.append((n.id, n.parent.id if n.parent else -1, n.last_access_time, as_list(n.key), as_list(n.value)))
        stack.extend(n.children.values())
    return sorted(nodes)


def _leaf_heap(tree) -> list:
    return sorted((t, i) for t, i, _ in tree._leaf_heap)


@pytest.mark.parametrize("page_size", [1, 4])
def test_touch_prefix_with_hints_equals_match_prefix(page_size):
    """Two trees driven by the same inserts and evictions, refreshed by ``match_prefix`` and by
    ``touch_prefix`` with carried hints: same nodes, stamps, clock, leaf heap and free list."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(1, 4, size=int(rng.integers(1, 6)) * page_size * 2) for _ in range(12)]

    def run(use_hints):
        tree, pool, alloc = make_tree(4096, page_size)
        hints = {}
        step = np.random.default_rng(11)
        for t in range(60):
            i = int(step.integers(len(prompts)))
            if t % 3 == 0:
                toks = prompts[i]
                tree.insert(RadixKey(toks), np.asarray(alloc.alloc(len(toks))))
            elif t % 7 == 0:
                tree.evict(int(step.integers(1, 3 * page_size)))
            for j in range(len(prompts)):
                if use_hints:
                    hints[j] = tree.touch_prefix(lambda j=j: RadixKey(prompts[j]), hints.get(j))
                else:
                    tree.match_prefix(RadixKey(prompts[j]))
        return tree._clock, _tree_nodes(tree), _leaf_heap(tree), as_list(alloc.free_pages)

    assert run(True) == run(False)


@pytest.mark.parametrize("page_size", [1, 4])
def test_prompt_reinsert_along_the_path_equals_the_insert(page_size):
    """The FULL-only checkpoint's prompt re-insert follows the just-inserted path: same split, stamps and
    clock as ``insert(prompt, prev_prefix_len=len(prompt))``, which compares tokens node by node."""
    def run(fast):
        tree, pool, alloc = make_tree(64, page_size)
        toks = np.arange(1, 25, dtype=np.int64)
        slots = np.asarray(alloc.alloc(24))
        tree.insert(RadixKey(toks[:8]), slots[:8])
        last = tree.insert(RadixKey(toks), slots, prev_prefix_len=8).last_node  # path: [0, 8), [8, 24)
        if fast:
            tree._reinsert_prefix(last, 12)
        else:
            tree.insert(RadixKey(toks[:12]), slots[:12], prev_prefix_len=12)
        return tree._clock, _tree_nodes(tree), _leaf_heap(tree)

    clock, nodes, _ = run(True)
    # by id: root, [0, 8), then [8, 24) keeps its id as the tail [12, 24); its new parent [8, 12) is the newest
    assert [len(k) for *_, k, _v in nodes] == [0, 8, 12, 4]
    assert run(True) == run(False)


@pytest.mark.parametrize("page_size", [1, 4])
def test_long_keys_match_up_to_the_first_unequal_page(page_size):
    """Keys past 8192 tokens compare in place rather than as bytes: same lengths."""
    tree, pool, alloc = make_tree(20000, page_size)
    toks = np.arange(1, 10001, dtype=np.int64)
    tree.insert(RadixKey(toks), np.asarray(alloc.alloc(10000)))
    assert tree.match_prefix(RadixKey(toks)).prefix_len == 10000
    other = toks.copy()
    other[9001] = 0  # token 9001 differs: page 1 keeps 9001 tokens, page 4 the 2250 whole pages before it
    assert tree.match_prefix(RadixKey(other)).prefix_len == (9001 if page_size == 1 else 9000)


# ---------------------------------------------------------------- the interface the scheduler types its tree as
TREE_METHODS = ("reset", "supports_prefix_sharing", "match_prefix", "evict_for_alloc", "evictable_size",
                "full_evictable_size", "protected_size", "lock", "unlock", "path_device_indices", "checkpoint",
                "check_integrity")


def test_every_tree_implements_the_base_interface():
    """The scheduler calls its tree through BasePrefixCache, whose declarations only raise NotImplementedError:
    every tree poolsim builds must override each of them, and the hybrid trees their own hooks."""
    from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
    from poolsim.pools.mem_cache.mamba_radix_cache import MambaRadixCache
    from poolsim.pools.mem_cache.no_cache import DisabledRadixCache
    from poolsim.pools.mem_cache.swa_radix_cache import SWARadixCache

    def own(cls, name):
        return getattr(cls, name) is not getattr(BasePrefixCache, name)

    for cls in (RadixCache, MambaRadixCache, SWARadixCache, DisabledRadixCache):
        assert [m for m in TREE_METHODS if not own(cls, m)] == [], cls.__name__
    assert own(RadixCache, "touch_prefix")
    assert all(own(MambaRadixCache, m) for m in ("track_after_extend", "decode_tracks", "commit_decode_track",
                                                    "supports_mamba", "evict_mamba"))
    assert all(own(SWARadixCache, m) for m in ("swa_evictable_size", "swa_protected_size", "supports_swa"))
    tree, _, _ = make_tree(8, 1)
    with pytest.raises(NotImplementedError):  # a plain tree has no mamba tracks to ask for
        tree.decode_tracks([])


def test_a_node_key_is_a_view_only_of_ids_nothing_can_rewrite():
    """Inserted keys are kept as views when the array owning them is read-only (a request's token ids), and
    copied otherwise: rewriting a writeable source afterwards must not change what the tree matches."""
    tree, pool, alloc = make_tree(32, 1)
    frozen = np.arange(100, 110, dtype=np.int64)
    frozen.flags.writeable = False
    node = tree.insert(RadixKey(frozen[:6]), alloc.alloc(6)).last_node
    assert np.shares_memory(node.key, frozen)
    scratch = np.arange(200, 206, dtype=np.int64)
    other = tree.insert(RadixKey(scratch), alloc.alloc(6)).last_node
    assert not np.shares_memory(other.key, scratch)
    scratch[:] = 0  # the caller reuses its buffer
    assert tree.match_prefix(RadixKey(np.arange(200, 206))).prefix_len == 6
    assert tree.match_prefix(RadixKey(np.zeros(6, dtype=np.int64))).prefix_len == 0
    assert tree.match_prefix(RadixKey(frozen)).prefix_len == 6
