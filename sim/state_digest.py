"""A hash of one server's whole pool state: what a fast path must leave exactly as the step-by-step loop does.

Counts hide slot-id mistakes (two requests swapping slots, a page freed to the wrong end of the free list);
this digest does not: it covers the free lists in order, the staged frees, every request row up to
``width`` positions, the row -> state slot mapping, every tree node (key, slots, LRU time, locks, state slot)
and the scheduler's own counters. Used by the reference-equivalence test and ``bench/sim_mooncake.py``.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _ids(h, label: str, x) -> None:
    h.update(label.encode())
    h.update(np.ascontiguousarray(np.asarray(x, dtype=np.int64)).tobytes())


def pool_state_digest(sched, width: int) -> str:
    """sha256 of the scheduler's pools and tree; the ``req_to_token`` rows ever used are hashed up to ``width``
    columns (the longest sequence the trace can reach), never the whole lazily mapped table."""
    h = hashlib.sha256()
    alloc, pool, tree = sched.allocator, sched.req_to_token_pool, sched.tree_cache
    xp = alloc.xp
    _ids(h, "free", xp.to_numpy(alloc._free.to_array()))
    for part in alloc.staged:
        _ids(h, "staged", xp.to_numpy(part))
    _ids(h, "rows_free", pool.free_slots)
    table = pool.req_to_token if pool.xp.name == "numpy" else pool.req_to_token.cpu().numpy()
    used = np.flatnonzero(table[:, 0])  # every row ever handed out wrote its position 0
    _ids(h, "used_rows", used)
    for row in used:
        h.update(np.ascontiguousarray(table[row, :width]).tobytes())
    mamba = getattr(pool, "mamba_allocator", None)
    if mamba is not None:
        _ids(h, "mamba_free", xp.to_numpy(mamba.free_slots))
        _ids(h, "mamba_group", list(mamba._group or []))
        _ids(h, "row_to_state", pool.req_index_to_mamba_index_mapping)
    if not getattr(tree, "disable", False):
        _tree(h, tree)
    h.update(repr((sched.forward_ct, sched.new_token_ratio.current, sched.retraction_events)).encode())
    return h.hexdigest()


def _tree(h, tree) -> None:
    h.update(repr((tree._clock, tree._next_id, tree.evictable_size_, tree.protected_size_,
                   tree.num_evicted_tokens, sorted(n.id for n in tree.evictable_leaves))).encode())
    if hasattr(tree, "mamba_lru"):
        h.update(repr((list(tree.mamba_lru), tree.mamba_evictable_size_, tree.mamba_protected_size_)).encode())
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        h.update(repr((node.id, node.parent.id if node.parent is not None else -1, node.extra_key, node.lock_ref,
                       node.last_access_time, node.mamba_value, node.mamba_lock_ref)).encode())
        _ids(h, "key", node.key)
        _ids(h, "value", node.value if node.value is not None else [])
        stack.extend(sorted(node.children.values(), key=lambda n: n.id, reverse=True))
