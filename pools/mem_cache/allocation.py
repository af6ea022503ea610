"""The request KV lifecycle (SGLang 0.5.23 ``mem_cache/allocation.py`` and ``mem_cache/common.py``).

    match (admission)  ->  alloc_for_extend  ->  alloc_for_decode ...  ->  release_kv_cache
                              ^  checkpoint_kv_cache between prefill chunks

Eviction always asks the tree for the shortfall only (``evict_from_tree_cache``); an allocation
that still fails raises ``OutOfMemoryError`` (SGLang's ``RuntimeError("Out of memory")``).

| row range of a request                     | owner                  | freed by                      |
|--------------------------------------------|------------------------|-------------------------------|
| ``[0, cache_protected_len)``               | the tree (locked path) | tree eviction, never the req  |
| ``[cache_protected_len, kv_committed_len)``| the request            | insert (duplicates), release  |
"""

from __future__ import annotations

import numpy as np

from poolsim.pools.errors import OutOfMemoryError
from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
from poolsim.pools.mem_cache.pool.req_to_token import ReqToTokenPool
from poolsim.pools.mem_cache.radix_cache import RadixKey
from poolsim.pools.mem_cache.req_kv import ReqKvInfo

_EMPTY = np.empty(0, dtype=np.int64)


def evict_from_tree_cache(tree_cache: BasePrefixCache, num_tokens: int) -> int:
    """Evict only the shortfall ``num_tokens - available``; returns tokens evicted."""
    if not tree_cache.supports_prefix_sharing():
        return 0
    allocator = tree_cache.token_to_kv_pool_allocator
    if hasattr(allocator, "evict_to_free_tokens"):  # two pools: each pool's own shortfall
        return allocator.evict_to_free_tokens(tree_cache, num_tokens)
    shortfall = num_tokens - allocator.available_size()
    return tree_cache.evict_for_alloc(shortfall) if shortfall > 0 else 0


def check_decode_capacity(tree_cache: BasePrefixCache, num_tokens: int) -> bool:
    """Evict the shortfall, then whether ``num_tokens`` slots are free (``check_decode_capacity``)."""
    evict_from_tree_cache(tree_cache, num_tokens)
    return tree_cache.token_to_kv_pool_allocator.available_size() >= num_tokens


def match_prefix_for_req(req, tree_cache: BasePrefixCache, max_prefix_len: int | None = None,
                         cow_mamba: bool | None = None):
    """Admission-time match of ``origin + output`` capped at ``len - 1`` (``init_next_round_input``)."""
    n = req.seqlen
    cap = max(n - 1, 0) if max_prefix_len is None else max_prefix_len
    result = tree_cache.match_prefix(RadixKey(req.token_ids(cap), req.extra_key), req=req,
                                     cow_mamba=tree_cache.supports_mamba() if cow_mamba is None else cow_mamba)
    req.prefix_len = result.prefix_len
    req.last_node = result.last_node
    req.kv.cache_protected_len = result.prefix_len
    req.mamba_branching_seqlen = result.mamba_branching_seqlen
    req.swa_branching_seqlen = result.swa_branching_seqlen
    return result


def _prefix_indices(req, tree_cache: BasePrefixCache, req_to_token_pool) -> np.ndarray | None:
    """The prefix slots to write into a fresh row; None when the request's own row already holds them
    (a continuing chunk): copying them out and back would write the same values."""
    if req.kv.holds_kv:
        return None
    if req.prefix_len == 0:
        return _EMPTY
    return tree_cache.path_device_indices(req.last_node)[: req.prefix_len]


def ensure_mamba_capacity(req_to_token_pool, reqs, tree_cache: BasePrefixCache) -> bool:
    """Evict tree-held mamba states until the batch's new working and tracking slots fit."""
    if not hasattr(req_to_token_pool, "mamba_allocator"):
        return True
    needed = sum((not r.kv.holds_mamba) + (req_to_token_pool.mamba_initial_tracking_slots
                                            if r.kv.mamba_ping_pong_track_buffer is None else 0) for r in reqs)
    available = req_to_token_pool.mamba_allocator.available_size()
    if available < needed and tree_cache.supports_mamba():
        tree_cache.evict_mamba(needed - available)
    return req_to_token_pool.mamba_allocator.available_size() >= needed


def alloc_req_slots(reqs, tree_cache: BasePrefixCache, req_to_token_pool: ReqToTokenPool) -> list[int]:
    """Rows for requests that hold none (LIFO), after making room for their mamba slots."""
    ensure_mamba_capacity(req_to_token_pool, reqs, tree_cache)
    rows = req_to_token_pool.alloc(reqs)
    if rows is None:
        raise OutOfMemoryError(f"alloc_req_slots runs out of memory: {req_to_token_pool.available_size()} rows "
                               f"free. Set a smaller --max-running-requests.")
    return rows


def alloc_token_slots(tree_cache: BasePrefixCache, num_tokens: int) -> np.ndarray:
    allocator = tree_cache.token_to_kv_pool_allocator
    evict_from_tree_cache(tree_cache, num_tokens)
    out = allocator.alloc(num_tokens)
    if out is None:
        raise OutOfMemoryError(f"Out of memory. Try to allocate {num_tokens} tokens; "
                               f"available {allocator.available_size()}, evictable {tree_cache.evictable_size()}")
    return np.asarray(out, dtype=np.int64)


def alloc_for_extend(reqs, tree_cache: BasePrefixCache, req_to_token_pool: ReqToTokenPool) -> np.ndarray:
    """Allocate ``[prefix_len, extend_end)`` of every request and write its row; returns out_cache_loc."""
    allocator = tree_cache.token_to_kv_pool_allocator
    ps = allocator.page_size
    prefixes = [_prefix_indices(r, tree_cache, req_to_token_pool) for r in reqs]
    prefix_lens = np.array([r.prefix_len for r in reqs], dtype=np.int64)
    seq_lens = np.array([r.extend_end for r in reqs], dtype=np.int64)
    extend_num_tokens = int((seq_lens - prefix_lens).sum())
    alloc_req_slots(reqs, tree_cache, req_to_token_pool)
    if ps == 1:
        out = alloc_token_slots(tree_cache, extend_num_tokens)
    else:
        table = req_to_token_pool.req_to_token
        last_loc = np.array([-1 if r.prefix_len == 0 else p[-1] if p is not None
                             else int(table[r.kv.req_pool_idx, r.prefix_len - 1])
                             for r, p in zip(reqs, prefixes)], dtype=np.int64)
        evict_from_tree_cache(tree_cache, extend_num_tokens + len(reqs) * ps)  # conservative: a new page each
        out = allocator.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        if out is None:
            raise OutOfMemoryError(f"Prefill out of memory. Try to allocate {extend_num_tokens} tokens; "
                                   f"available {allocator.available_size()}, evictable {tree_cache.evictable_size()}")
        out = np.asarray(out, dtype=np.int64)
    table = req_to_token_pool
    start = 0
    for r, prefix, pre, seq in zip(reqs, prefixes, prefix_lens, seq_lens):
        row = r.kv.req_pool_idx
        if pre and prefix is not None:
            table.write((row, slice(0, int(pre))), prefix)
        table.write((row, slice(int(pre), int(seq))), out[start: start + int(seq - pre)])
        start += int(seq - pre)
        r.kv.kv_allocated_len = int(seq)
        r.kv.kv_committed_len = int(seq)
    return out


def alloc_for_decode(reqs, tree_cache: BasePrefixCache, req_to_token_pool: ReqToTokenPool) -> np.ndarray:
    """One new slot per request at position ``kv_committed_len``."""
    return alloc_for_decode_kvs([r.kv for r in reqs], tree_cache, req_to_token_pool)


def alloc_for_decode_kvs(kvs: list[ReqKvInfo], tree_cache: BasePrefixCache,
                         req_to_token_pool: ReqToTokenPool) -> np.ndarray:
    """``alloc_for_decode`` on the requests' ``ReqKvInfo``: a caller that holds typed requests (the scheduler's
    batch) reads ``r.kv`` natively in the compiled build."""
    allocator = tree_cache.token_to_kv_pool_allocator
    ps = allocator.page_size
    # every request on every decode step: native loops when compiled; page size 1 needs no row/length arrays
    if ps == 1:
        out = alloc_token_slots(tree_cache, len(kvs))
        req_to_token_pool.write_decode(kvs, out)
    else:
        rows = np.array([kv.req_pool_idx for kv in kvs], dtype=np.int64)
        seq_lens = np.array([kv.kv_committed_len for kv in kvs], dtype=np.int64)
        last_loc = np.asarray(req_to_token_pool.req_to_token[rows, seq_lens - 1], dtype=np.int64)
        evict_from_tree_cache(tree_cache, len(kvs) * ps)
        out = allocator.alloc_decode(seq_lens + 1, last_loc)
        if out is None:
            raise OutOfMemoryError(f"Decode out of memory. Try to allocate {len(kvs)} tokens; "
                                   f"available {allocator.available_size()}, evictable {tree_cache.evictable_size()}")
        out = np.asarray(out, dtype=np.int64)
        req_to_token_pool.write((rows, seq_lens), out)
    for kv in kvs:
        kv.kv_allocated_len += 1
        kv.kv_committed_len += 1
    return out


def spec_decode_alloc_lens(kvs: list[ReqKvInfo], reserve: int, page_size: int) -> tuple[list[int], list[int], int]:
    """``page_aligned_decode_alloc_lens`` (allocation_sizing.py:73-93): each row's allocation grows to
    ``max(kv_allocated_len, ceil_page(kv_committed_len + reserve))``. Returns (cur, nxt, tokens needed)."""
    cur, nxt, needed = [], [], 0
    for kv in kvs:
        c = kv.kv_allocated_len
        n = max(c, (kv.kv_committed_len + reserve + page_size - 1) // page_size * page_size)
        cur.append(c)
        nxt.append(n)
        needed += n - c
    return cur, nxt, needed


def spec_new_tokens_required_next_decode(kvs: list[ReqKvInfo], reserve: int, page_size: int) -> int:
    """``_new_tokens_required_next_decode_spec_v2`` (schedule_batch.py:3421-3430): the slots the next speculative
    decode step takes, in whole pages."""
    total = 0
    for kv in kvs:
        cur = kv.kv_allocated_len
        nxt = cur + max(0, kv.kv_committed_len + reserve - cur)
        total += -(-nxt // page_size) * page_size - -(-cur // page_size) * page_size
    return total


def alloc_for_spec_decode(kvs: list[ReqKvInfo], tree_cache: BasePrefixCache, req_to_token_pool: ReqToTokenPool,
                          reserve: int) -> np.ndarray:
    """``alloc_for_spec_decode`` (allocation.py:780-848) after ``eagle_prepare_for_decode``'s lengths
    (eagle_utils.py:865-921): grow every row to its reservation, in batch order. Page 1: ``alloc_token_slots`` of
    the total (the free list's head); beyond: ``alloc_extend`` from each row's ``kv_allocated_len``, after evicting
    for ``needed + bs x page`` (``alloc_paged_token_slots_extend``, :175-201). Only ``kv_allocated_len`` moves; the
    verify result commits. Returns the new slots (out_cache_loc)."""
    allocator = tree_cache.token_to_kv_pool_allocator
    ps = allocator.page_size
    cur, nxt, needed = spec_decode_alloc_lens(kvs, reserve, ps)
    if needed <= 0:
        return _EMPTY
    if ps == 1:
        out = alloc_token_slots(tree_cache, needed)
    else:
        rows = np.array([kv.req_pool_idx for kv in kvs], dtype=np.int64)
        cur_arr = np.array(cur, dtype=np.int64)
        last_loc = np.asarray(req_to_token_pool.req_to_token[rows, cur_arr - 1], dtype=np.int64)
        evict_from_tree_cache(tree_cache, needed + len(kvs) * ps)
        out = allocator.alloc_extend(cur_arr, np.array(nxt, dtype=np.int64), last_loc, needed)
        if out is None:
            raise OutOfMemoryError(f"Decode out of memory. Try to allocate {needed} tokens; "
                                   f"available {allocator.available_size()}, evictable {tree_cache.evictable_size()}")
        out = np.asarray(out, dtype=np.int64)
    start = 0
    for kv, c, n in zip(kvs, cur, nxt):
        if n > c:
            req_to_token_pool.write((kv.req_pool_idx, slice(c, n)), out[start: start + n - c])
            start += n - c
        kv.kv_allocated_len = n
    return out


def checkpoint_kv_cache(req, tree_cache: BasePrefixCache) -> None:
    """Publish a chunked request's computed prefix (``stash_chunked_request``)."""
    tree_cache.checkpoint(req, up_to=req.extend_end)
    req.prefix_len = req.extend_end


def release_kv_cache(req, tree_cache: BasePrefixCache, checkpoint: bool) -> None:
    """Give the request's row back. With ``checkpoint`` (a finished request) the tree first keeps what
    it can key; retraction and abort pass ``checkpoint=False``: nothing is inserted."""
    kv: ReqKvInfo = req.kv
    pool = tree_cache.req_to_token_pool
    if not kv.holds_kv:
        # A mamba tree may have handed the request a slot at match time (copy-on-write target).
        if kv.holds_mamba:
            pool.mamba_allocator.free([kv.mamba_pool_idx])
            kv.mamba_pool_idx = None
        return
    owned = req.owned_kv_len()
    if checkpoint:
        tree_cache.checkpoint(req, up_to=owned)
    tree_cache.free_kv_row(kv, kv.cache_protected_len, owned)
    tree_cache.unlock(req.lock)
    req.lock = None
    ps = tree_cache.token_to_kv_pool_allocator.page_size
    over_start = -(-owned // ps) * ps
    if over_start < kv.kv_allocated_len:  # slots allocated past what the request keeps (overlap lookahead)
        tree_cache.free_kv_row(kv, over_start, kv.kv_allocated_len)
    tree_cache.on_release(req, checkpointed=checkpoint)
    pool.free(req)
