"""Page size 1 (SGLang 0.5.23 ``mem_cache/allocator/token.py``): ``free_pages`` starts ``1..size``; ``alloc``
takes from the head; ``free`` appends (FIFO) or, under ``need_sort``, goes to ``release_pages``."""

from __future__ import annotations

from typing import Any

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from poolsim.pools.mem_cache.allocator.free_list import FreeList


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
