"""Each speed fast path in the pools against the plain reference beside it, the way SGLang does it: the same
table, tree, stamps, clock, leaf heap and free lists after every operation of random scripts.

- ``ReqToTokenPool.write_decode`` (reuses the previous write's flat positions) vs ``write_decode_reference``;
- ``RadixCache.touch_prefix`` (replays a hint) vs ``touch_prefix_reference`` (a whole match from the root);
- ``insert(from_node=...)`` (resumes below a chunk's locked node) vs ``insert`` from the root;
- ``_reinsert_prefix`` (the prompt split along the just-inserted path) vs ``_reinsert_prefix_reference``.
The waiting-queue refresh that carries the hints is checked in tests/sim/test_schedule_policy.py."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolsim.pools import (
    HybridReqToTokenPool,
    MambaCacheParams,
    MambaStateShape,
    PagedTokenToKVPoolAllocator,
    PoolError,
    RadixCache,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from poolsim.pools.errors import MambaCapacityError, OutOfMemoryError
from poolsim.pools.mem_cache.allocation import (
    alloc_for_decode,
    alloc_for_extend,
    checkpoint_kv_cache,
    match_prefix_for_req,
    release_kv_cache,
)
from poolsim.pools.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from poolsim.pools.mem_cache.mamba_radix_cache import MambaRadixCache
from poolsim.pools.mem_cache.radix_cache import RadixKey
from poolsim.pools.mem_cache.req_kv import ReqKvInfo
from poolsim.pools.mem_cache.swa_radix_cache import SWARadixCache
from tests.helpers import FakeReq, tree_state


# ---------------------------------------------------------------- write_decode
def _decode_script(seed: int, rows: int, ctx: int, nreq: int):
    """(kind, payload) ops for two pools: decode batches (mostly the previous batch one on), requests that
    skip a step, move rows, restart or finish, a cleared pool, and writes that must raise."""
    rng = random.Random(seed)
    free = list(range(1, rows + 1))
    rng.shuffle(free)
    reqs = {i: [free.pop(), rng.randrange(ctx // 2)] for i in range(nreq)}  # request -> [row, committed]
    batch = list(reqs)
    for _ in range(120):
        op = rng.random()
        if op < 0.55:
            pass  # the same batch, one position on
        elif op < 0.7:
            batch = rng.sample(sorted(reqs), rng.randint(1, len(reqs)))  # another subset, another order
        elif op < 0.78:
            i = rng.choice(sorted(reqs))
            reqs[i][1] += 1  # skipped a step
        elif op < 0.86 and free:
            i = rng.choice(sorted(reqs))
            free.append(reqs[i][0])
            reqs[i][0] = free.pop(0)  # another row, same length (a retracted request readmitted)
        elif op < 0.92:
            i = rng.choice(sorted(reqs))
            reqs[i][1] = 0  # restarted in its row
        elif op < 0.95:
            yield "clear", None
            continue
        for i in batch:
            if reqs[i][1] >= ctx:
                reqs[i][1] = 0  # finished: a new request in the same row
        if op >= 0.95:  # the batch with a request that cannot be written, at a random place: nothing is written
            yield "raise", ([(i, *reqs[i]) for i in batch], rng.choice(["no_row", "past_end"]),
                            rng.randrange(len(batch) + 1))
            if rng.random() < 0.5:
                for i in batch:
                    reqs[i][1] = min(reqs[i][1] + 1, ctx - 1)  # the stamped requests one on
            continue
        yield "write", ([(i, *reqs[i]) for i in batch], [rng.randrange(1, 1 << 20) for _ in batch])
        for i in batch:
            reqs[i][1] += 1


@pytest.mark.parametrize("rows,ctx,nreq", [(4, 8, 3), (8, 16, 6), (3, 5, 1)], ids=lambda v: str(v))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_write_decode_equals_the_reference(rows, ctx, nreq, seed):
    fast, ref = ReqToTokenPool(rows, ctx), ReqToTokenPool(rows, ctx)
    kvs: dict = {}  # request -> its ReqKvInfo, one per pool (the fast path stamps its own)
    for kind, payload in _decode_script(seed, rows, ctx, nreq):
        if kind == "clear":
            fast.clear()
            ref.clear()
            continue
        pair = []
        for i, row, pos in payload[0]:
            a, b = kvs.setdefault(i, (ReqKvInfo(), ReqKvInfo()))
            a.req_pool_idx = b.req_pool_idx = row
            a.kv_committed_len = b.kv_committed_len = pos
            pair.append((a, b))
        if kind == "raise":
            _, bad, at = payload
            wrong = ReqKvInfo(req_pool_idx=None if bad == "no_row" else 1, kv_committed_len=ctx)
            pair.insert(at, (wrong, wrong))
            with pytest.raises(PoolError):
                fast.write_decode([a for a, _ in pair], [7] * len(pair))
            with pytest.raises(PoolError):
                ref.write_decode_reference([b for _, b in pair], [7] * len(pair))
        else:
            values = np.asarray(payload[1], dtype=np.int64)
            fast.write_decode([a for a, _ in pair], values)
            ref.write_decode_reference([b for _, b in pair], values)
        assert np.array_equal(fast.req_to_token, ref.req_to_token)


def test_write_decode_reference_on_torch():
    pytest.importorskip("torch")
    fast, ref = ReqToTokenPool(4, 8, device="cpu"), ReqToTokenPool(4, 8, device="cpu")
    a, b = (ReqKvInfo(req_pool_idx=2, kv_committed_len=3), ReqKvInfo(req_pool_idx=2, kv_committed_len=3))
    for step in range(4):
        fast.write_decode([a], np.array([10 + step]))
        ref.write_decode_reference([b], np.array([10 + step]))
        a.kv_committed_len += 1
        b.kv_committed_len += 1
    assert fast.req_to_token.tolist() == ref.req_to_token.tolist()
    assert ref.req_to_token[2, 3:7].tolist() == [10, 11, 12, 13]


# ---------------------------------------------------------------- the trees: random request lifecycles
MAMBA_PARAMS = MambaCacheParams(shape=MambaStateShape.kimi_linear(tp=1, num_heads=2, head_dim=4), layers=[0, 1])
ROWS, CTX, KV_SIZE = 8, 96, 160
KINDS = ["radix-page1", "radix-page4", "mamba", "swa"]


class ReinsertReference(RadixCache):
    """The FULL tree with its prompt re-insert done the reference way (SGLang's second insert)."""

    def _reinsert_prefix(self, node, length):
        self._reinsert_prefix_reference(node, length)


def make_tree(kind: str, reinsert_reference: bool = False):
    if kind.startswith("radix"):
        ps = int(kind[-1])
        alloc = TokenToKVPoolAllocator(KV_SIZE) if ps == 1 else PagedTokenToKVPoolAllocator(KV_SIZE, ps)
        return (ReinsertReference if reinsert_reference else RadixCache)(ReqToTokenPool(ROWS, CTX), alloc)
    if kind == "mamba":
        pool = HybridReqToTokenPool(ROWS, CTX, 64, MAMBA_PARAMS)
        return MambaRadixCache(pool, TokenToKVPoolAllocator(KV_SIZE), strategy="no_buffer")
    return SWARadixCache(ReqToTokenPool(ROWS, CTX), SWATokenToKVPoolAllocator(KV_SIZE, KV_SIZE // 2, 1),
                         sliding_window_size=6)


def run_lifecycles(kind: str, seed: int, touch="fast", from_node="fast", reinsert="fast", ops: int = 80):
    """Random arrivals, waiting-queue touches, admissions (whole or chunked), chunk checkpoints, decodes,
    finishes, retractions and evictions on one tree; each fast path switched to its reference by its argument.
    Returns the state after every operation and how often each fast path had a case to take."""
    rng = random.Random(seed)
    tree = make_tree(kind, reinsert_reference=reinsert == "reference")
    pool = tree.req_to_token_pool
    bases = [[rng.randrange(4) for _ in range(16)] for _ in range(3)]  # shared system prompts: splits galore
    waiting, hints, live, states = [], {}, [], []
    cases = {"touch_replay": 0, "from_node": 0, "reinsert": 0}

    def checkpoint(req):
        if req.lock is req.last_node and req.kv.cache_protected_len > 0:
            cases["from_node"] += 1
        if from_node == "reference":
            req.last_node = None  # what checkpoint reads only to pass from_node: the insert walks from the root
        checkpoint_kv_cache(req, tree)

    def release(req, finished):
        req.done = finished
        ps = tree.page_size
        if finished and 0 < req.origin_input_len // ps * ps < req.kv.kv_committed_len // ps * ps:
            cases["reinsert"] += 1
        release_kv_cache(req, tree, checkpoint=finished)

    for _ in range(ops):
        op = rng.random()
        if op < 0.2:
            prompt = rng.choice(bases)[: rng.randint(0, 16)] + [rng.randrange(4) for _ in range(rng.randint(1, 28))]
            waiting.append(FakeReq(prompt + [rng.randrange(4) for _ in range(rng.randint(0, 10))],
                                   origin_input_len=len(prompt)))
        elif op < 0.35:
            for r in waiting[::-1]:
                if touch == "reference":
                    tree.touch_prefix_reference(lambda r=r: RadixKey(r.token_ids(r.origin_input_len)))
                else:
                    cases["touch_replay"] += hints.get(r) is not None
                    hints[r] = tree.touch_prefix(lambda r=r: RadixKey(r.token_ids(r.origin_input_len)), hints.get(r))
        elif op < 0.55 and waiting and pool.available_size():
            req = waiting.pop(rng.randrange(len(waiting)))
            hints.pop(req, None)
            n = req.origin_input_len
            match_prefix_for_req(req, tree, max_prefix_len=n - 1)
            req.lock = tree.lock(req.last_node)
            req.extend_end = rng.randint(req.prefix_len + 1, n) if rng.random() < 0.6 else n
            try:
                alloc_for_extend([req], tree, pool)
                live.append(req)
            except (OutOfMemoryError, MambaCapacityError):
                if not req.kv.holds_kv:  # no row yet: release_kv_cache would keep the lock
                    tree.unlock(req.lock)
                release_kv_cache(req, tree, checkpoint=False)
        elif op < 0.8 and live:
            req = rng.choice(live)
            try:
                if req.extend_end < req.origin_input_len:
                    checkpoint(req)
                    req.extend_end = rng.randint(req.extend_end + 1, req.origin_input_len)
                    alloc_for_extend([req], tree, pool)
                else:
                    batch = [r for r in live if r.extend_end >= r.origin_input_len and r.kv.kv_committed_len < r.seqlen]
                    if batch:
                        alloc_for_decode(batch, tree, pool)
            except (OutOfMemoryError, MambaCapacityError):
                live.remove(req)
                release(req, finished=False)
        elif op < 0.93 and live:
            req = live.pop(rng.randrange(len(live)))
            release(req, finished=req.extend_end >= req.origin_input_len and rng.random() < 0.8)
        else:
            tree.evict(rng.randint(1, 24))
        tree.check_integrity()
        states.append(tree_state(tree, live))
    return states, cases


def assert_same_states(fast, ref):
    assert len(fast) == len(ref)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert a == b, f"operation {i}: {[k for k in a if a[k] != b.get(k)]} differ"


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_touch_prefix_equals_a_whole_match_from_the_root(kind, seed):
    fast, _ = run_lifecycles(kind, seed)
    ref, _ = run_lifecycles(kind, seed, touch="reference")
    assert_same_states(fast, ref)


@pytest.mark.parametrize("kind", ["radix-page1", "radix-page4", "mamba"])  # the SWA tree never takes from_node
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_insert_from_the_locked_node_equals_the_insert_from_the_root(kind, seed):
    fast, _ = run_lifecycles(kind, seed)
    ref, _ = run_lifecycles(kind, seed, from_node="reference")
    assert_same_states(fast, ref)


@pytest.mark.parametrize("kind", ["radix-page1", "radix-page4"])  # only a FULL-only tree re-inserts the prompt
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_prompt_reinsert_along_the_path_equals_the_insert_from_the_root(kind, seed):
    fast, _ = run_lifecycles(kind, seed)
    ref, _ = run_lifecycles(kind, seed, reinsert="reference")
    assert_same_states(fast, ref)


@pytest.mark.parametrize("kind", KINDS)
def test_every_fast_path_at_once_and_the_scripts_reach_them(kind):
    """All references together against all fast paths, over fixed seeds that between them give each fast path
    many cases to take (a script that never reached one would make the tests above vacuous)."""
    total = {"touch_replay": 0, "from_node": 0, "reinsert": 0}
    for seed in range(8):
        fast, cases = run_lifecycles(kind, seed, ops=200)
        ref, _ = run_lifecycles(kind, seed, ops=200, touch="reference", from_node="reference",
                                reinsert="reference" if kind.startswith("radix") else "fast")
        assert_same_states(fast, ref)
        total = {k: total[k] + cases[k] for k in total}
    assert total["touch_replay"] >= 200, total
    if kind != "swa":
        assert total["from_node"] >= 40, total
    if kind.startswith("radix"):
        assert total["reinsert"] >= 20, total
