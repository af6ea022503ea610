"""The mamba state slot allocator (SGLang 0.5.23 ``mem_cache/allocator/mamba.py``): FIFO slots with group
pre-allocation."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from poolsim.pools.backend import get_backend
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.free_list import FreeMask


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
