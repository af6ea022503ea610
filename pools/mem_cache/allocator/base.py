"""What every token->KV slot allocator shares (SGLang 0.5.23 ``mem_cache/allocator/base.py``).

Index semantics follow SGLang exactly (docs/sglang.md section 2):
- page size 1: ``free_pages`` starts ``1..size``; ``alloc`` takes from the head; ``free`` appends
  (FIFO) or, under ``need_sort``, goes to ``release_pages`` until an allocation runs short.
- paged: page ids ``1..size//page_size``; ``free`` prepends the sorted unique page ids (LIFO);
  ``free_page_ids``/``free_segment`` prepend pages in the given order; under ``need_sort`` freed
  pages are staged and merged+sorted only when an allocation runs short.
Slot/page 0 is never handed out: padded tokens write there.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from poolsim.pools.backend import get_backend
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.free_list import FreeList


class BaseTokenToKVPoolAllocator(abc.ABC):
    _free: FreeList  # set by clear()
    checks = True  # double-free and ownership checks; set_checks(False) before use skips them

    def __init__(self, size: int, page_size: int, need_sort: bool = False, device: str | None = None,
                 kvcache=None):
        if size < 0:
            raise PoolError(f"allocator size must be >= 0, got {size}")
        if page_size < 1 or page_size & (page_size - 1):
            raise PoolError(f"page_size must be a power of two >= 1, got {page_size}")
        self.size = size
        self.page_size = page_size
        self.need_sort = need_sort
        self.device = device
        self.xp = get_backend(device)
        self._kvcache = kvcache
        self.free_group: list | None = None
        self.clear()

    # -- sizes ---------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    @property
    def free_pages(self) -> Any:
        return self._free.to_array()

    @abc.abstractmethod
    def clear(self) -> None:
        """Reset to the initial free list (and call ``_clear_staged``)."""

    @abc.abstractmethod
    def free(self, free_index) -> None:
        """Return slots to the pool (or to the open free group)."""

    def available_size(self) -> int:
        return (len(self._free) + self.num_staged) * self.page_size

    # -- need_sort staging: freed ids wait here, unsorted and counted as available, until an alloc runs short
    def _clear_staged(self) -> None:
        self.staged: list = []
        self.num_staged = 0

    def _stage(self, ids) -> None:
        self._free.mark_free(ids)
        self.staged.append(self.xp.keep(ids))
        self.num_staged += len(ids)

    def merge_and_sort_free(self) -> None:
        if self.staged:
            self._free.replace(self.xp.sort(self.xp.cat([self._free.to_array(), *self.staged])))
            self._clear_staged()

    def get_kvcache(self):
        return self._kvcache

    def set_checks(self, enabled: bool) -> None:
        """Turn the double-free checks off (or on) for a fresh allocator; ids handed out do not change."""
        self.checks = self._free.checks = enabled

    # -- free groups ----------------------------------------------------------------------
    def free_group_begin(self) -> None:
        if self.free_group is not None:
            raise PoolError("free groups cannot be nested")
        self.free_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(self.xp.cat(pending))

    def free_segment(self, free_index, *, start_pos: int) -> None:
        """Free one request's ``kv_row[start_pos : start_pos + n]``; ``start_pos`` is page-aligned."""
        if start_pos % self.page_size:
            raise PoolError(f"segment start {start_pos} is not page-aligned (page_size {self.page_size})")
        self.free(free_index)

    # -- integrity ------------------------------------------------------------------------
    def _all_free_ids(self) -> np.ndarray:
        staged = [self.xp.to_numpy(p) for p in self.staged]
        return np.concatenate([self.xp.to_numpy(self._free.to_array()), *staged])

    def check_integrity(self) -> None:
        ids = self._all_free_ids()
        what = self._free.what
        if ids.size and (ids.min() < 1 or ids.max() > self.num_pages):
            raise PoolError(f"free list holds {what} outside 1..{self.num_pages}")
        if ids.size and np.bincount(ids).max() > 1:
            raise PoolError(f"a {what} is on the free list twice")
        if not self._free.is_free(ids).all() or self._free.num_marked_free() != ids.size:
            raise PoolError(f"free list and {what} ownership disagree")
        if ids.size * self.page_size != self.available_size():
            raise PoolError("available_size() disagrees with the free list")
