"""Paged slots (SGLang 0.5.23 ``mem_cache/allocator/paged.py``): page ids ``1..size//page_size``; ``free``
prepends the sorted unique page ids (LIFO); under ``need_sort`` freed pages are staged and merged only when an
allocation runs short."""

from __future__ import annotations

import numpy as np

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from poolsim.pools.mem_cache.allocator.free_list import FreeList


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Page size > 1 (``allocator/paged.py``): every request's slots are page-aligned."""

    def clear(self) -> None:
        self._free = FreeList(self.xp, self.size // self.page_size, "page", self.checks)
        self._clear_staged()  # SGLang's staged_pages / num_staged_pages
        self.free_group = None
        self.free_page_ids_group: list = []

    def _expand(self, pages):
        ps = self.page_size
        host = self.xp.to_numpy(pages)
        return self.xp.asarray((host[:, None] * ps + np.arange(ps)).reshape(-1))

    def alloc(self, need_size: int):
        if need_size < 0 or need_size % self.page_size:
            raise PoolError(f"paged alloc of {need_size} tokens is not a multiple of page_size {self.page_size}")
        num_pages = need_size // self.page_size
        if num_pages > len(self._free):
            self.merge_and_sort_free()
        if num_pages > len(self._free):
            return None
        return self._expand(self._free.take(num_pages))

    def alloc_extend(self, prefix_lens, seq_lens, last_loc, extend_num_tokens: int):
        """Slots for ``[prefix_len, seq_len)`` of each request, in batch order (three-phase fill).

        Phase 1 fills the prefix's partial last page contiguously after ``last_loc``; phases 2
        and 3 take new pages from the head of the free list, in batch order.
        """
        prefix = np.asarray(self.xp.to_numpy(prefix_lens), dtype=np.int64)
        seq = np.asarray(self.xp.to_numpy(seq_lens), dtype=np.int64)
        last = np.asarray(self.xp.to_numpy(last_loc), dtype=np.int64)
        ps, bs = self.page_size, len(prefix)
        extend = seq - prefix
        if (extend < 0).any() or int(extend.sum()) != extend_num_tokens:
            raise PoolError("alloc_extend: extend_num_tokens must equal sum(seq_lens - prefix_lens) >= 0")
        if ((last + 1) % ps != prefix % ps).any():
            raise PoolError("alloc_extend: last_loc must be the prefix's last slot (or -1 for an empty prefix)")
        # SGLang merges staged pages on a cheap upper bound before computing the exact count.
        if extend_num_tokens // ps + bs + 1 > len(self._free):
            self.merge_and_sort_free()
        ceil_prefix = -(-prefix // ps) * ps
        pages_per_req = -(-seq // ps) - ceil_prefix // ps
        num_new_pages = int(pages_per_req.sum())
        if num_new_pages > len(self._free):
            return None
        new_pages = self.xp.to_numpy(self._free.take(num_new_pages))
        # Per token: its request, its absolute position.
        owner = np.repeat(np.arange(bs), extend)
        starts = np.cumsum(extend) - extend
        pos = np.arange(extend_num_tokens) - starts[owner] + prefix[owner]
        phase1 = pos < ceil_prefix[owner]
        page_base = (np.cumsum(pages_per_req) - pages_per_req)[owner]
        rel = pos - ceil_prefix[owner]
        new_page = new_pages[np.where(phase1, 0, page_base + rel // ps)] if num_new_pages else 0
        out = np.where(phase1, last[owner] + 1 + pos - prefix[owner], new_page * ps + pos % ps)
        return self.xp.asarray(out)

    def alloc_decode(self, seq_lens, last_loc):
        """One slot per request; ``seq_lens`` counts the new token. New page iff ``seq_len % ps == 1``."""
        seq = np.asarray(self.xp.to_numpy(seq_lens), dtype=np.int64)
        last = np.asarray(self.xp.to_numpy(last_loc), dtype=np.int64)
        ps = self.page_size
        if ((last + 2) % ps != seq % ps).any():
            raise PoolError("alloc_decode: last_loc must be the slot of token seq_len - 2")
        if len(seq) > len(self._free):
            self.merge_and_sort_free()
        need = (seq - 1) % ps == 0
        num_new_pages = int(need.sum())
        if num_new_pages > len(self._free):
            return None
        new_pages = self.xp.to_numpy(self._free.take(num_new_pages))
        out = last + 1
        out[need] = new_pages * ps
        return self.xp.asarray(out)

    def free(self, free_index) -> None:
        free_index = self.xp.asarray(free_index)
        if len(free_index) == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self.xp.keep(free_index))
        else:
            self._release_page_ids(self.xp.unique(free_index // self.page_size))

    def free_segment(self, free_index, *, start_pos: int) -> None:
        """Page-aligned start and contiguous per-page tokens: ``free_index[::ps]`` hits each page once."""
        free_index = self.xp.asarray(free_index)
        if start_pos % self.page_size:
            raise PoolError(f"segment start {start_pos} is not page-aligned (page_size {self.page_size})")
        if len(free_index):
            self.free_page_ids(free_index[:: self.page_size] // self.page_size)

    def free_page_ids(self, page_ids) -> None:
        """Free exactly these pages, in this order; no dedup."""
        page_ids = self.xp.asarray(page_ids)
        if len(page_ids) == 0:
            return
        if self.free_group is None:
            self._release_page_ids(page_ids)
        else:
            self.free_page_ids_group.append(self.xp.keep(page_ids))

    def _release_page_ids(self, page_ids) -> None:
        if self.need_sort:
            self._stage(page_ids)
        else:
            self._free.push_front(page_ids)

    def free_group_end(self) -> None:
        super().free_group_end()
        if self.free_page_ids_group:
            pending, self.free_page_ids_group = self.free_page_ids_group, []
            self._release_page_ids(self.xp.cat(pending))
