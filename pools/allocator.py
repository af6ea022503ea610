"""Token->KV slot allocators and the mamba slot allocator (SGLang 0.5.23 ``mem_cache/allocator/``).

Index semantics follow SGLang exactly (SGLANG_SPEC.md section 2):
- page size 1: ``free_pages`` starts ``1..size``; ``alloc`` takes from the head; ``free`` appends
  (FIFO) or, under ``need_sort``, goes to ``release_pages`` until an allocation runs short.
- paged: page ids ``1..size//page_size``; ``free`` prepends the sorted unique page ids (LIFO);
  ``free_page_ids``/``free_segment`` prepend pages in the given order; under ``need_sort`` freed
  pages are staged and merged+sorted only when an allocation runs short.
Slot/page 0 is never handed out: padded tokens write there.
"""

from __future__ import annotations

import abc
from collections import deque
from typing import Any

import numpy as np

from pools.backend import get_backend
from pools.errors import PoolError
from pools.free_list import FreeList, FreeMask


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


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Page size 1 (``allocator/token.py``)."""

    def __init__(self, size: int, need_sort: bool = False, device: str | None = None, kvcache=None):
        super().__init__(size, 1, need_sort, device, kvcache)

    def clear(self) -> None:
        self._free = FreeList(self.xp, self.size, "slot", self.checks)
        self._clear_staged()
        self.free_group = None

    @property
    def release_pages(self) -> Any:
        """SGLang's name for the staged slots of the page-1 allocator."""
        return self.xp.cat(self.staged) if self.staged else self.xp.empty()

    def alloc(self, need_size: int):
        if need_size < 0:
            raise PoolError(f"alloc of a negative size {need_size}")
        if self.need_sort and need_size > len(self._free):
            self.merge_and_sort_free()
        if need_size > len(self._free):
            return None
        return self._free.take(need_size)

    def free(self, free_index) -> None:
        free_index = self.xp.asarray(free_index)
        if len(free_index) == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self.xp.keep(free_index))
        elif self.need_sort:
            self._stage(free_index)
        else:
            self._free.push_back(free_index)

    def free_page_ids(self, page_ids) -> None:
        self.free(page_ids)  # page size 1: page ids are slot ids



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



class MambaSlotAllocator:
    """Free list of mamba state slots (``allocator/mamba.py``): slot 0 reserved, head alloc, FIFO free.

    Slots come and go one at a time (a request's working slot, a tree node's state), so the free list is a deque
    of ints: the KV allocators' array segments would cost an array conversion per slot here. Under checks the KV
    free lists' ``FreeMask`` refuses double frees and slots out of range."""

    checks = True

    def __init__(self, size: int, device: str | None = None):
        if size < 0:
            raise PoolError(f"mamba pool size must be >= 0, got {size}")
        self.size = size
        self.device = device
        self.xp = get_backend(device)
        self._group: list[int] | None = None
        self.clear()

    def clear(self) -> None:
        self._free: deque[int] = deque(range(1, self.size + 1))
        self._mask = FreeMask(self.size, "mamba slot")  # kept under checks only
        self._group = None

    @property
    def free_slots(self) -> Any:
        return self.xp.asarray(list(self._free))

    def set_checks(self, enabled: bool) -> None:
        self.checks = enabled

    def available_size(self) -> int:
        return len(self._free)

    def alloc_group_begin(self, num_reqs: int) -> None:
        """Pre-allocate ``num_reqs`` slots that following ``alloc(1)`` calls drain (all or nothing)."""
        self._group = None
        if 0 < num_reqs <= len(self._free):
            self._group = self._take(num_reqs)

    def alloc_group_end(self) -> None:
        if self._group:
            self.free(self._group)
        self._group = None

    def alloc(self, need_size: int):
        if need_size == 1:
            slot = self.alloc_one()
            return None if slot is None else self.xp.asarray([slot])
        if need_size > len(self._free):
            return None
        return self.xp.asarray(self._take(need_size))

    def alloc_one(self) -> int | None:
        """``alloc(1)``'s slot as an int, None when none is free: for callers that want the id, not an array."""
        if self._group:
            return self._group.pop(0)
        if not self._free:
            return None
        return self._take(1)[0]

    def _take(self, n: int) -> list[int]:
        free = self._free
        out = [free.popleft() for _ in range(n)]
        if self.checks:
            self._mask.mark(np.asarray(out, dtype=np.int64), free=False)
        return out

    def free(self, free_index) -> None:
        if isinstance(free_index, list):
            ids = [int(i) for i in free_index]
        else:
            ids = self.xp.to_numpy(free_index).tolist()
        if self.checks:
            host = np.asarray(ids, dtype=np.int64)
            self._mask.check_freeable(host)
            self._mask.mark(host, free=True)
        self._free.extend(ids)

    def check_integrity(self) -> None:
        ids = np.asarray(list(self._free), dtype=np.int64)
        if ids.size and (ids.min() < 1 or ids.max() > self.size):
            raise PoolError("mamba free list holds slots outside 1..size")
        if ids.size and np.bincount(ids).max() > 1:
            raise PoolError("a mamba slot is on the free list twice")
        pending = len(self._group or [])
        if self._mask.count() != ids.size:
            raise PoolError("mamba free list and slot ownership disagree")
        if ids.size + pending > self.size:
            raise PoolError("more mamba slots free than exist")
