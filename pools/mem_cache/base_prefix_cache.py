"""What every prefix cache shares (SGLang's ``BasePrefixCache``): its pools, giving a request's own row
positions back, and the interface the scheduler calls. ``RadixCache`` and ``DisabledRadixCache`` build on it,
so callers never branch on whether the radix cache is on. The scheduler's code types its tree as this class,
which lets the compiled build call these methods directly instead of looking each one up by name."""

from __future__ import annotations

from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in swa_* (not compiled)
class BasePrefixCache:
    disable = False
    num_evicted_tokens = 0  # running total, for metrics
    num_mamba_evicted_tokens = 0  # the part of it evicted to free mamba state slots (evict_mamba)

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size: int | None = None):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size or token_to_kv_pool_allocator.page_size

    # ---------------------------------------------------------------- what every tree implements
    # Abstract: each is overridden by every tree poolsim builds (RadixCache, MambaRadixCache, SWARadixCache,
    # DisabledRadixCache; tests/pools/test_radix_cache.py checks it). Declared here, and only those the scheduler
    # calls, so its typed calls compile to direct ones. Each docstring says what the call changes. A node (or
    # lock) a call returns stays valid only while it is locked: an unlocked node may be evicted, and a split may
    # replace it, by any later call that changes the tree.
    def reset(self) -> None:
        """Changes: everything. Drops every node (their slots are not freed: the pools are reset beside it) and
        zeroes the sizes; only the root remains, locked."""
        raise NotImplementedError

    def supports_prefix_sharing(self) -> bool:
        """Changes nothing. False for the disabled cache: it matches nothing and keeps nothing."""
        raise NotImplementedError

    def match_prefix(self, key, **kwargs) -> Any:
        """Changes the tree's shape and recency, never its slots: the longest cached page-aligned prefix of
        ``key``, splitting the node it ends inside and stamping the path as recently used. Locks nothing.
        Returns a ``MatchResult``: the matched slots (``device_indices``) and the last matched node; lock that node
        before allocating anything, or an eviction may free the slots just matched."""
        raise NotImplementedError

    def evict_for_alloc(self, num_tokens: int) -> int:
        """Changes the tree and the allocator: frees unlocked leaves in LRU order until ``num_tokens`` slots are
        back in the allocator (or nothing unlocked is left). Returns the tokens freed. Locked paths are untouched."""
        raise NotImplementedError

    def evictable_size(self) -> int:
        """Changes nothing. Slots held by unlocked nodes: what an eviction could free now."""
        raise NotImplementedError

    def full_evictable_size(self) -> int:
        """Changes nothing. The full-attention pool's part of ``evictable_size`` (hybrid trees count more pools)."""
        raise NotImplementedError

    def protected_size(self) -> int:
        """Changes nothing. Slots held by locked nodes (on a running request's path)."""
        raise NotImplementedError

    def lock(self, node) -> Any:
        """Changes lock counts only: locks ``node`` and its path to the root, moving their slots from evictable to
        protected. Returns the handle ``unlock`` takes (a node; the SWA tree's is a pair)."""
        raise NotImplementedError

    def unlock(self, lock) -> None:
        """Changes lock counts only: undoes one ``lock``; a path whose count drops to zero becomes evictable.
        ``None`` is a no-op."""
        raise NotImplementedError

    def path_device_indices(self, node) -> np.ndarray:
        """Changes nothing. The slots on the root path of ``node``, in token order (safe while it is locked)."""
        raise NotImplementedError

    def checkpoint(self, req, up_to: int) -> None:
        """Changes the tree, the request's row and the allocator: inserts the request's tokens ``[0, up_to)``
        (the slots it holds there that the tree already had are freed), points its row at the tree's slots and
        moves its lock to the node the insert ended on. ``req`` must hold a lock from an earlier match or
        checkpoint."""
        raise NotImplementedError

    def check_integrity(self) -> None:
        """Changes nothing. Raises ``PoolError`` when the sizes or the evictable-leaf set disagree with a full walk
        of the tree (``run --check`` calls it after every step)."""
        raise NotImplementedError

    def touch_prefix(self, make_key, hint=None) -> Any:
        """Changes what ``match_prefix(make_key())`` changes (splits, recency) and nothing else, for the
        waiting-queue refresh; returns a hint that makes the next call with the same key cheaper. Only on a tree
        that shares prefixes (the refresh skips a disabled one)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- hybrid trees only (after supports_*())
    def supports_mamba(self) -> bool:
        return False

    def supports_swa(self) -> bool:
        return False

    def mamba_evictable_size(self) -> int:
        return 0

    def evict_mamba(self, num: int) -> int:
        return 0

    # Abstract for a plain tree: the scheduler calls these only after supports_mamba() / supports_swa().
    def track_after_extend(self, req, prefix_len: int, extend_end: int) -> None:
        raise NotImplementedError

    def decode_tracks(self, reqs, kvs=None) -> dict[Any, tuple[int, int]]:
        raise NotImplementedError

    def commit_decode_track(self, req, track: tuple[int, int]) -> None:
        raise NotImplementedError

    def swa_evictable_size(self) -> int:
        raise NotImplementedError

    def swa_protected_size(self) -> int:
        raise NotImplementedError

    def on_release(self, req, checkpointed: bool) -> None:
        """Hook after a row is given back: a mamba tree frees the state slots it did not take."""

    def free_kv_row(self, kv, start: int, end: int) -> None:
        """Free a request's own row positions ``[start, end)`` (``start`` page-aligned)."""
        if end > start:
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
            self.token_to_kv_pool_allocator.free_segment(np.asarray(row[start:end], dtype=np.int64),
                                                         start_pos=start)
