"""What every prefix cache shares (SGLang's ``BasePrefixCache``): its pools, and giving a request's own
row positions back. ``RadixCache`` and ``DisabledRadixCache`` build on it, so callers never branch on
whether the radix cache is on."""

from __future__ import annotations

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

    def supports_mamba(self) -> bool:
        return False

    def supports_swa(self) -> bool:
        return False

    def mamba_evictable_size(self) -> int:
        return 0

    def evict_mamba(self, num: int) -> int:
        return 0

    def on_release(self, req, checkpointed: bool) -> None:
        """Hook after a row is given back: a mamba tree frees the state slots it did not take."""

    def free_kv_row(self, kv, start: int, end: int) -> None:
        """Free a request's own row positions ``[start, end)`` (``start`` page-aligned)."""
        if end > start:
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
            self.token_to_kv_pool_allocator.free_segment(np.asarray(row[start:end], dtype=np.int64),
                                                         start_pos=start)
