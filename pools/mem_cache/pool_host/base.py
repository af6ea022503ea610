"""HiCache's host pool (SGLang 0.5.23 ``mem_cache/pool_host/base.py`` ``HostKVCache``): its size, SGLang's warning
and refusal, and its slot allocator. The subclasses (``mha.py``, ``mla.py``, ``mamba.py``) only say how many bytes
one token (or one state slot) takes.

Sizing (``HostKVCache.__init__``, ``pool_host/base.py:212-229``):

    size = int(hicache_size * 1e9 // size_per_token)          --hicache-size GB given (> 0)
         = int(device_capacity_tokens * hicache_ratio)        otherwise
    page_num = size // page_size + 1                           one padding page, and it is allocatable
    size = page_num * page_size

then ``_allocate_host_buffer`` (``:237-257``) warns when ``size <= device_capacity_tokens`` and refuses when
``size * size_per_token`` exceeds this rank's host-memory budget: ``(available RAM - 10 GiB) // ranks on the host``
(``host_memory_budget_bytes``, ``:84-108``; the reserve ``HICACHE_HOST_MEMORY_RESERVE_BYTES``, ``:28``).

Allocator (``clear``/``alloc``/``free``, ``:502-576``): ``free_slots = arange(size)`` (slot 0 is a slot like any
other: no padding slot is held back); ``alloc(n)`` takes the first ``n`` free slots (``n`` page-aligned) and
returns None when fewer than ``n`` are free; ``free`` parks the slots in ``release_slots``, appended behind
``free_slots`` only when an allocation needs more than ``free_slots`` holds (``_merge_release_slots``).
"""

from __future__ import annotations

import numpy as np

from poolsim.pools.errors import PoolError, SizingError

HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * (1 << 30)  # pool_host/base.py:28: RAM left to the OS and other processes
GB = 1e9  # --hicache-size is decimal GB (pool_host/base.py:223)


def host_memory_budget_bytes(available_bytes: int, ranks_per_host: int) -> int:
    """What one rank may claim for its host pools (``host_memory_budget_bytes``, ``pool_host/base.py:104-108``)."""
    return (int(available_bytes) - HICACHE_HOST_MEMORY_RESERVE_BYTES) // max(1, ranks_per_host)


class HostKVCache:
    """One host pool: ``size`` slots of ``size_per_token`` bytes (``size`` includes the padding page)."""

    pool_label = "kv"

    def __init__(self, size_per_token: int, device_capacity_tokens: int, host_to_device_ratio: float,
                 host_size: float, page_size: int, budget_bytes: int | None = None,
                 host_token_capacity: int | None = None):
        """``host_token_capacity``: an exact, page-aligned size, no padding page added (SGLang's parameter of
        that name, ``pool_host/base.py:212-219``; the simulator builds the pool a plan sized)."""
        if size_per_token <= 0:
            raise PoolError(f"host pool: size_per_token {size_per_token} must be > 0")
        self.size_per_token = int(size_per_token)
        self.device_capacity_tokens = int(device_capacity_tokens)
        self.page_size = page_size
        if host_token_capacity is not None:
            if host_token_capacity <= 0 or host_token_capacity % page_size:
                raise PoolError(f"Host token capacity must be positive and page-aligned, got {host_token_capacity} "
                                f"for page_size={page_size}")
            self.page_num = host_token_capacity // page_size
            self.size = host_token_capacity
        else:
            if host_size > 0:
                size = int(host_size * GB // self.size_per_token)
            else:
                size = int(device_capacity_tokens * host_to_device_ratio)
            self.page_num = size // page_size + 1  # the padding page (pool_host/base.py:227-229)
            self.size = self.page_num * page_size
        self.warnings: list[str] = []
        if self.size <= self.device_capacity_tokens:  # pool_host/base.py:238-246
            self.warnings.append(
                f"HiCache {self.pool_label} host pool ({self.size} tokens) is smaller than the device pool "
                f"({self.device_capacity_tokens} tokens); L2 cache effectiveness is reduced. Consider increasing "
                "--hicache-ratio (or --hicache-size) for higher L2 cache hit rate.")
        requested = self.size * self.size_per_token
        if budget_bytes is not None and requested > budget_bytes:  # pool_host/base.py:249-257
            raise SizingError(f"Not enough host memory available. Requesting {requested / 1e9:.2f} GB but only have "
                              f"{budget_bytes / 1e9:.2f} GB free. Please reduce the size of the hierarchical cache "
                              "(--hicache-ratio / --hicache-size), or give the machine's RAM with --host-memory-gib.")
        self.clear()

    def size_bytes(self) -> int:
        """The host buffer: ``size x size_per_token`` (what SGLang logs as "GB host memory", in bytes)."""
        return self.size * self.size_per_token

    # ------------------------------------------------------------------ slots
    def clear(self) -> None:
        self.free_slots = np.arange(self.size, dtype=np.int64)
        self.release_slots: list[np.ndarray] = []
        self.num_release_slots = 0

    def available_size(self) -> int:
        return len(self.free_slots) + self.num_release_slots

    def _merge_release_slots(self) -> None:
        if self.num_release_slots == 0:
            return
        self.free_slots = np.concatenate([self.free_slots, *self.release_slots])
        self.release_slots = []
        self.num_release_slots = 0

    def alloc(self, need_size: int) -> np.ndarray | None:
        if need_size % self.page_size:
            raise PoolError(f"host alloc of {need_size} slots: not a multiple of page size {self.page_size}")
        if need_size > self.available_size():
            return None
        if need_size > len(self.free_slots):
            self._merge_release_slots()
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        out.flags.writeable = False  # a node keeps these as its host value
        return out

    def free(self, indices: np.ndarray) -> int:
        n = len(indices)
        if n:
            self.release_slots.append(np.asarray(indices, dtype=np.int64))
            self.num_release_slots += n
        return n

    def check_integrity(self, held: int) -> None:
        """``held``: slots the tree's nodes hold. Free + held == size, no slot twice (``run --check``)."""
        free = np.concatenate([self.free_slots, *self.release_slots]) if self.release_slots else self.free_slots
        if len(free) + held != self.size:
            raise PoolError(f"host pool: {len(free)} free + {held} held by the tree != size {self.size}")
        seen = np.zeros(self.size, dtype=bool)
        seen[free] = True
        if int(seen.sum()) != len(free):
            raise PoolError("host pool: a slot is free twice")
