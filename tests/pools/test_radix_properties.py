"""Random request lifecycles through the radix cache: conservation and integrity after every operation,
and every match checked against a brute-force longest-common-prefix over the tree's own paths."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolsim.pools import PagedTokenToKVPoolAllocator, RadixCache, RadixKey, ReqToTokenPool, TokenToKVPoolAllocator
from poolsim.pools.errors import OutOfMemoryError
from poolsim.pools.mem_cache.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    match_prefix_for_req,
    release_kv_cache,
)
from tests.helpers import FakeReq, assert_conserved


def tree_paths(tree):
    """Every root-to-node token path in the tree."""
    out, stack = [], [(n, n.key) for n in tree.root_node.children.values()]
    while stack:
        node, path = stack.pop()
        out.append(path)
        stack.extend((c, np.concatenate([path, c.key])) for c in node.children.values())
    return out


def brute_force_match(tree, tokens, ps):
    best = 0
    for path in tree_paths(tree):
        n = min(len(path), len(tokens))
        neq = np.flatnonzero(path[:n] != tokens[:n])
        best = max(best, int(neq[0]) if neq.size else n)
    return best // ps * ps


@pytest.mark.parametrize("ps", [1, 4])
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_lifecycles_conserve_and_match(ps, seed):
    rng = random.Random(seed)
    size = 96
    pool = ReqToTokenPool(6, 128)
    alloc = TokenToKVPoolAllocator(size) if ps == 1 else PagedTokenToKVPoolAllocator(size, ps)
    tree = RadixCache(pool, alloc)
    bases = [[rng.randrange(5) for _ in range(12)] for _ in range(3)]  # shared "system prompts"
    live = []
    for _ in range(40):
        op = rng.random()
        if op < 0.45 and pool.available_size():
            toks = rng.choice(bases)[: rng.randint(0, 12)] + [rng.randrange(5) for _ in range(rng.randint(1, 10))]
            req = FakeReq(toks + [rng.randrange(5) for _ in range(6)], origin_input_len=len(toks))
            want = brute_force_match(tree, np.asarray(toks[:-1], dtype=np.int64), ps) if len(toks) > 1 else 0
            res = match_prefix_for_req(req, tree, max_prefix_len=len(toks) - 1)
            assert res.prefix_len == want
            req.lock = tree.lock(req.last_node)
            req.extend_end = rng.randint(req.prefix_len + 1, len(toks)) if rng.random() < 0.3 else len(toks)
            try:
                alloc_for_extend([req], tree, pool)
            except OutOfMemoryError:
                tree.unlock(req.lock)
                if req.kv.holds_kv:
                    pool.free(req)
                assert_conserved(tree, live, size)
                continue
            live.append(req)
        elif op < 0.65 and live:
            req = rng.choice(live)
            if req.extend_end < req.origin_input_len:  # a chunk: publish it, then extend the rest
                checkpoint_kv_cache(req, tree)
                req.extend_end = req.origin_input_len
                try:
                    alloc_for_extend([req], tree, pool)
                except OutOfMemoryError:
                    live.remove(req)
                    release_kv_cache(req, tree, checkpoint=False)
            elif req.kv.kv_committed_len < req.seqlen:
                try:
                    alloc_for_decode([req], tree, pool)
                except OutOfMemoryError:
                    pass
        elif live:
            req = live.pop(rng.randrange(len(live)))
            if req.extend_end < req.origin_input_len or rng.random() < 0.3:
                release_kv_cache(req, tree, checkpoint=False)  # retraction / abort
            else:
                req.done = True
                release_kv_cache(req, tree, checkpoint=True)
        assert_conserved(tree, live, size)
    for req in live:
        release_kv_cache(req, tree, checkpoint=False)
    tree.evict(size)
    assert alloc.available_size() == size and tree.total_size() == 0
