"""``--disable-radix-cache``: SGLang builds ``UnifiedRadixCache(disable=True)``. It matches nothing,
keeps nothing and evicts nothing; a request frees everything it allocated. Same interface as
``RadixCache``, so callers never branch on the flag."""

from __future__ import annotations

import numpy as np

from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
from poolsim.pools.mem_cache.radix_cache import InsertResult, MatchResult, TreeNode

_EMPTY = np.empty(0, dtype=np.int64)


class DisabledRadixCache(BasePrefixCache):
    disable = True

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size: int | None = None):
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size)
        self.root_node = TreeNode(0, _EMPTY, _EMPTY, None)
        self.root_node.lock_ref = 1

    def reset(self) -> None:
        pass

    def supports_prefix_sharing(self) -> bool:
        return False

    def match_prefix(self, key, **kwargs) -> MatchResult:
        return MatchResult((), 0, self.root_node, 0)

    def insert(self, key, value, prev_prefix_len: int = 0, mamba_value=None) -> InsertResult:
        return InsertResult(0, self.root_node)

    def evict(self, num_tokens: int) -> int:
        return 0

    def evict_for_alloc(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def full_evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def lock(self, node):
        return None

    def unlock(self, lock) -> None:
        pass

    def path_device_indices(self, node) -> np.ndarray:
        return _EMPTY

    def checkpoint(self, req, up_to: int) -> None:
        """Nothing is published; a finished hybrid request's state slots go back with its row."""

    def on_release(self, req, checkpointed: bool) -> None:
        if hasattr(self.req_to_token_pool, "free_mamba_cache") and req.kv.holds_mamba:
            self.req_to_token_pool.free_mamba_cache(req)

    def check_integrity(self) -> None:
        pass
