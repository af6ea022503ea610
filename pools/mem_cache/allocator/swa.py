"""``SWATokenToKVPoolAllocator`` (SGLang 0.5.23 ``mem_cache/allocator/swa.py:41-700``), without the
per-request SWA ring.

Two independent allocators, one per pool, and ``full_to_swa_index_mapping``: for every full-pool slot,
its SWA peer (0: none; the trailing entry is -1, so a ``last_loc`` of -1 maps to -1). Callers hold
full-pool indices only. ``free_swa`` releases just the SWA peers (what decode does to tokens that left
the window); ``free`` releases the SWA peers first, then the full slots. The SWA radix cache
(``pools/mem_cache/swa_radix_cache.py``) and the SWA prefill budget (``sim/swa_prefill_adder.py``) run on it.
"""

from __future__ import annotations

import numpy as np

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from poolsim.pools.mem_cache.allocator.token import TokenToKVPoolAllocator


class SWATokenToKVPoolAllocator:
    def __init__(self, size: int, size_swa: int, page_size: int, need_sort: bool = False, device: str | None = None):
        self.page_size = page_size
        self.size_full, self.size_swa = size, size_swa
        if page_size == 1:
            self.full_attn_allocator = TokenToKVPoolAllocator(size, need_sort, device)
            self.swa_attn_allocator = TokenToKVPoolAllocator(size_swa, need_sort, device)
        else:
            self.full_attn_allocator = PagedTokenToKVPoolAllocator(size, page_size, need_sort, device)
            self.swa_attn_allocator = PagedTokenToKVPoolAllocator(size_swa, page_size, need_sort, device)
        self.xp = self.full_attn_allocator.xp
        self.full_to_swa_index_mapping = np.zeros(size + page_size + 1, dtype=np.int64)
        self.full_to_swa_index_mapping[-1] = -1
        self.clear()

    @property
    def size(self) -> int:
        return min(self.size_full, self.size_swa)

    @property
    def num_pages(self) -> int:  # the larger pool's page count paces --check's full free-list scans
        return max(self.full_attn_allocator.num_pages, self.swa_attn_allocator.num_pages)

    def set_checks(self, enabled: bool) -> None:
        self.full_attn_allocator.set_checks(enabled)
        self.swa_attn_allocator.set_checks(enabled)

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1] = 0  # the trailing -1 stays
        self.free_group: list | None = None
        self.swa_free_group: list = []
        self.swa_page_ids_group: list = []

    # -- sizes ------------------------------------------------------------------------------------
    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def translate_loc_from_full_to_swa(self, kv_indices):
        return self.xp.asarray(self.full_to_swa_index_mapping[self.xp.to_numpy(kv_indices)])

    def _set_mapping(self, full_indices, swa_indices) -> None:
        self.full_to_swa_index_mapping[self.xp.to_numpy(full_indices)] = self.xp.to_numpy(swa_indices)

    # -- alloc ------------------------------------------------------------------------------------
    def alloc(self, need_size: int):
        if self.page_size != 1:
            raise PoolError("SWATokenToKVPoolAllocator.alloc is for page_size 1")
        if need_size > self.full_available_size() or need_size > self.swa_available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        self._set_mapping(full, swa)
        return full

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens: int):
        """Both pools page in step: the same new pages count on each side (``get_num_new_pages``)."""
        ps = self.page_size
        prefix = np.asarray(self.xp.to_numpy(prefix_lens), dtype=np.int64)
        seq = np.asarray(self.xp.to_numpy(seq_lens), dtype=np.int64)
        num_new_pages = int((-(-seq // ps) - (-(-prefix // ps))).sum())
        if num_new_pages > self.full_available_size() // ps or num_new_pages > self.swa_available_size() // ps:
            return None
        swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
        full = self.full_attn_allocator.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        swa = self.swa_attn_allocator.alloc_extend(prefix_lens, seq_lens, swa_last_loc, extend_num_tokens)
        if full is None or swa is None:
            raise PoolError("alloc_extend: a pool ran short after the page check passed")
        self._set_mapping(full, swa)
        return full

    def alloc_decode(self, seq_lens, last_loc):
        swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
        full = self.full_attn_allocator.alloc_decode(seq_lens, last_loc)
        swa = self.swa_attn_allocator.alloc_decode(seq_lens, swa_last_loc)
        if full is None or swa is None:
            return None  # as SGLang: a side that did allocate keeps its pages taken
        self._set_mapping(full, swa)
        return full

    # -- free -------------------------------------------------------------------------------------
    def free(self, free_index) -> None:
        if len(free_index) == 0:
            return
        self.free_swa(free_index)  # first: it reads the mapping
        self.free_full(free_index)

    def free_full(self, free_index) -> None:
        if len(free_index) == 0:
            return
        if (self.full_to_swa_index_mapping[self.xp.to_numpy(free_index)] != 0).any():
            raise PoolError("free_full: a slot still has an SWA peer (call free)")
        self.full_attn_allocator.free(free_index)

    def free_swa(self, free_index) -> None:
        """Release the SWA peers of these full slots and clear their mapping; the full slots stay."""
        if len(free_index) == 0:
            return
        if self.page_size == 1:
            self._free_swa_pages(free_index)
            return
        # every slot of every touched page, duplicates kept; the paged free dedups
        host = self.xp.to_numpy(free_index)
        ps = self.page_size
        mapping_indices = ((host // ps * ps)[:, None] + np.arange(ps)).reshape(-1)
        swa_indices = self.full_to_swa_index_mapping[mapping_indices].copy()
        self.full_to_swa_index_mapping[mapping_indices] = 0
        if self.free_group is not None:
            self.swa_free_group.append(swa_indices)
            return
        self._release_swa(swa_indices)

    def free_swa_segment(self, free_index, *, start_pos: int) -> None:
        """``free_swa`` for a kv-row segment (page-aligned start): every slot must still have its peer."""
        if len(free_index) == 0:
            return
        if start_pos % self.page_size:
            raise PoolError(f"segment start {start_pos} is not page-aligned (page_size {self.page_size})")
        self._free_swa_pages(free_index)

    def free_full_segment(self, free_index, *, start_pos: int) -> None:
        """Full slots whose SWA peers are already gone (below a request's window, or a tombstoned node)."""
        if len(free_index) == 0:
            return
        if (self.full_to_swa_index_mapping[self.xp.to_numpy(free_index)] != 0).any():
            raise PoolError("free_full_segment: a slot still has an SWA peer (call free_segment)")
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)

    def set_full_to_swa_mapping(self, full_indices, swa_indices) -> None:
        self._set_mapping(full_indices, swa_indices)

    def clear_full_to_swa_mapping(self, full_indices) -> None:
        self.full_to_swa_index_mapping[self.xp.to_numpy(full_indices)] = 0

    def evict_to_free_tokens(self, tree_cache, num_tokens: int) -> int:
        """Ask the tree for each pool's shortfall (``allocator/swa.py:210-220``); returns full tokens evicted."""
        if not tree_cache.supports_prefix_sharing():
            return 0
        full_shortfall = max(0, num_tokens - self.full_available_size())
        swa_shortfall = max(0, num_tokens - self.swa_available_size())
        if full_shortfall or swa_shortfall:
            return tree_cache.evict_for_pools(full_shortfall, swa_shortfall)
        return 0

    def free_segment(self, free_index, *, start_pos: int) -> None:
        if len(free_index) == 0:
            return
        if start_pos % self.page_size:
            raise PoolError(f"segment start {start_pos} is not page-aligned (page_size {self.page_size})")
        self._free_swa_pages(free_index)
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)

    def _free_swa_pages(self, free_index) -> None:
        """One representative per full page; its peer page is the whole SWA page (both pools page in step)."""
        ps = self.page_size
        reps = self.xp.to_numpy(free_index)[::ps]
        swa_tokens = self.full_to_swa_index_mapping[reps]
        if (swa_tokens <= 0).any():
            raise PoolError("free_swa: a slot has no SWA peer (already released; call free_full)")
        swa_pages = swa_tokens // ps
        cleared = reps if ps == 1 else ((reps // ps * ps)[:, None] + np.arange(ps)).reshape(-1)
        self.full_to_swa_index_mapping[cleared] = 0
        if self.free_group is not None:
            self.swa_page_ids_group.append(swa_pages)
            return
        self.swa_attn_allocator.free_page_ids(self.xp.asarray(swa_pages))

    def _release_swa(self, swa_indices: np.ndarray) -> None:
        if self.page_size > 1:
            swa_indices = swa_indices[swa_indices > 0]  # the padding-slot entries the page expansion picked up
        self.swa_attn_allocator.free(self.xp.asarray(swa_indices))

    # -- free groups ------------------------------------------------------------------------------
    def free_group_begin(self) -> None:
        if self.free_group is not None:
            raise PoolError("free groups cannot be nested")
        self.free_group, self.swa_free_group, self.swa_page_ids_group = [], [], []
        self.full_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.free_group = None
        if self.swa_page_ids_group:
            pages, self.swa_page_ids_group = self.swa_page_ids_group, []
            self.swa_attn_allocator.free_page_ids(self.xp.asarray(np.concatenate(pages)))
        if self.swa_free_group:
            pending, self.swa_free_group = self.swa_free_group, []
            self._release_swa(np.concatenate(pending))
        self.full_attn_allocator.free_group_end()

    def check_integrity(self) -> None:
        self.full_attn_allocator.check_integrity()
        self.swa_attn_allocator.check_integrity()
        peers = self.full_to_swa_index_mapping[:-1]
        live = peers[peers > 0]
        if np.unique(live).size != live.size:
            raise PoolError("two full slots map to one SWA slot")
        if live.size + self.swa_available_size() > self.size_swa:
            raise PoolError("SWA slots mapped plus free exceed the SWA pool")
