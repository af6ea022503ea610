"""Request rows: ``req_to_token[row, pos]`` is the KV slot of token ``pos`` of the request on ``row``.

``ReqToTokenPool`` (``memory_pool.py``): row 0 is padding; ``free_slots`` is a list handed out
LIFO from its tail, freed rows are appended. ``HybridReqToTokenPool`` adds one mamba state slot
per request and the row -> slot mapping.
"""

from __future__ import annotations

import numpy as np

from poolsim.pools.backend import get_backend
from poolsim.pools.errors import DoubleFreeError, MambaCapacityError, PoolError
from poolsim.pools.mem_cache.pool.mamba import MambaCacheParams, MambaPool
from poolsim.pools.mem_cache.req_kv import ReqKvInfo


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: str | None = None):
        if size < 0 or max_context_len < 1:
            raise PoolError(f"ReqToTokenPool needs size >= 0 and max_context_len >= 1, got {size}, {max_context_len}")
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.xp = get_backend(device)
        self.req_to_token = self.xp.zeros_int32((size + 1, max_context_len))
        self._flat = self.req_to_token.reshape(-1)  # a view: position row * max_context_len + pos
        self._decode_writes = 0  # write_decode calls so far, never reset: the stamp it leaves on each request
        self.clear()

    def clear(self) -> None:
        self.free_slots: list[int] = list(range(1, self.size + 1))
        self.row_kv: dict = {}  # row -> the ReqKvInfo holding it (what --check's KV conservation counts)
        self._row_free = np.ones(self.size + 1, dtype=bool)
        self._row_free[0] = False
        self._decode_flat: np.ndarray | None = None  # write_decode's last flat positions (a fresh array each write)

    def table_bytes(self) -> int:
        return (self.size + 1) * self.max_context_len * 4

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc_rows(self, need_size: int) -> list[int] | None:
        if need_size < 0:
            raise PoolError(f"alloc_rows of a negative count {need_size}")
        if need_size > len(self.free_slots):
            return None
        if need_size == 0:
            return []
        rows = self.free_slots[-need_size:]
        del self.free_slots[-need_size:]
        self._row_free[rows] = False
        return rows

    def free_rows(self, rows) -> None:
        rows = [int(r) for r in rows]
        for r in rows:
            if r == 0:
                raise PoolError("freeing request row 0, the padding row")
            if not 0 < r <= self.size:
                raise PoolError(f"freeing request row {r} outside 1..{self.size}")
            if self._row_free[r]:
                raise DoubleFreeError(f"double free of request row {r}")
            self._row_free[r] = True
        self.free_slots.extend(rows)

    def alloc(self, reqs) -> list[int] | None:
        """Rows for the requests that hold none (a continuing chunked request keeps its row)."""
        fresh = [r for r in reqs if r.kv.req_pool_idx is None]
        rows = self.alloc_rows(len(fresh))
        if rows is None:
            return None
        for r, row in zip(fresh, rows):
            r.kv.req_pool_idx = row
            self.row_kv[row] = r.kv
        return [r.kv.req_pool_idx for r in reqs]

    def free(self, req) -> None:
        if req.kv.req_pool_idx is None:
            raise PoolError("freeing the row of a request that holds none")
        self.free_rows([req.kv.req_pool_idx])
        self.row_kv.pop(req.kv.req_pool_idx, None)
        req.kv.req_pool_idx = None

    def write(self, indices, values) -> None:
        """``req_to_token[indices] = values``; ``indices`` may be ``(row, slice)`` as in SGLang."""
        if isinstance(indices, tuple) and isinstance(indices[1], slice):
            row, sl = indices
            if sl.stop is not None and sl.stop > self.max_context_len:
                raise PoolError(f"write past max_context_len {self.max_context_len} (to position {sl.stop})")
        if self.xp.name == "torch":
            values = self.xp.asarray(values).to(self.req_to_token.dtype)
        self.req_to_token[indices] = values

    def write_decode(self, kvs: list[ReqKvInfo], values) -> None:
        """``req_to_token[kv.req_pool_idx, kv.kv_committed_len] = value`` for each request, in order: a decode
        step's one new slot per request, as one flat scatter.

        Most decode steps write the same requests as the step before, in the same order, each one position
        further on. Each request carries a stamp of its last write (which write, its index, the flat position);
        when every request's stamp says the previous write put it at the same index one position back, and that
        write had as many requests, the positions are exactly that write's plus one: one numpy add instead of a
        list of boxed ints converted to an array. Any other batch takes the list."""
        width = self.max_context_len
        prev, call = self._decode_flat, self._decode_writes
        # taken before any request is stamped: a write that raises part-way leaves nothing the next one reuses
        self._decode_flat, self._decode_writes = None, call + 1
        same = len(kvs) > 0 and prev is not None and len(prev) == len(kvs)
        i = 0
        for kv in kvs:
            row, pos = kv.req_pool_idx, kv.kv_committed_len
            if row is None:
                raise PoolError("a decode write for a request that holds no row")
            if not 0 <= pos < width:
                raise PoolError(f"write past max_context_len {width} (to position {pos})")
            f = row * width + pos
            if same and (kv.decode_write != call or kv.decode_index != i or kv.decode_flat != f - 1):
                same = False
            kv.decode_write, kv.decode_index, kv.decode_flat = call + 1, i, f
            i += 1
        if same and prev is not None:
            flat = prev + 1
        else:
            flat = np.fromiter([kv.decode_flat for kv in kvs], dtype=np.int64, count=len(kvs))
        self._decode_flat = flat
        if self.xp.name == "torch":
            self._flat[self.xp.asarray(flat)] = self.xp.asarray(values).to(self.req_to_token.dtype)
        else:
            self._flat.put(flat, values)

    def write_decode_reference(self, kvs: list[ReqKvInfo], values) -> None:
        """``write_decode`` as SGLang writes it (``req_to_token_pool.write((req_pool_indices, locs), out)``): each
        request's slot at ``req_to_token[row, kv_committed_len]``, one by one, no stamps. The test that the two
        agree is tests/pools/test_fast_paths.py."""
        for kv in kvs:
            if kv.req_pool_idx is None:
                raise PoolError("a decode write for a request that holds no row")
            pos = kv.kv_committed_len
            if not 0 <= pos < self.max_context_len:
                raise PoolError(f"write past max_context_len {self.max_context_len} (to position {pos})")
        for kv, value in zip(kvs, values):
            self.req_to_token[kv.req_pool_idx, kv.kv_committed_len] = int(value)

    def check_integrity(self) -> None:
        free = self.free_slots
        if len(set(free)) != len(free):
            raise PoolError("a request row is on the free list twice")
        ids = np.asarray(free, dtype=np.int64)
        if ids.size and (ids.min() < 1 or ids.max() > self.size):
            raise PoolError("the request-row free list holds row 0 or a row out of range")
        if int(self._row_free.sum()) != len(free):
            raise PoolError("request-row free list and row ownership disagree")


class HybridReqToTokenPool(ReqToTokenPool):
    """Request rows plus mamba state slots: one working slot per request and, under the
    ``extra_buffer`` strategy, ``mamba_ping_pong_track_buffer_size`` checkpoint slots."""

    def __init__(self, size: int, max_context_len: int, mamba_size: int, cache_params: MambaCacheParams,
                 device: str | None = None, mamba_ping_pong_track_buffer_size: int = 0):
        super().__init__(size, max_context_len, device)
        self.mamba_pool = MambaPool(mamba_size, cache_params, device)
        self.mamba_allocator = self.mamba_pool.allocator
        self.enable_mamba_extra_buffer = mamba_ping_pong_track_buffer_size > 0
        self.mamba_ping_pong_track_buffer_size = mamba_ping_pong_track_buffer_size
        self.mamba_initial_tracking_slots = mamba_ping_pong_track_buffer_size  # non-lazy: all up front
        self.req_index_to_mamba_index_mapping = np.zeros(size + 1, dtype=np.int64)

    def _alloc_slot(self) -> int:
        got = self.mamba_allocator.alloc_one()
        if got is None:
            raise MambaCapacityError(
                "Not enough space for mamba cache, try to increase --mamba-full-memory-ratio or "
                f"--max-mamba-cache-size (size {self.mamba_pool.size}, all in use)")
        return got

    def alloc(self, reqs) -> list[int] | None:
        """Rows for requests without one, then a working slot (and tracking slots) for requests
        without one; a slot shortage is SGLang's assert."""
        rows = super().alloc(reqs)
        if rows is None:
            return None
        for req in reqs:
            kv: ReqKvInfo = req.kv
            if kv.mamba_pool_idx is None:
                kv.mamba_pool_idx = self._alloc_slot()
            if self.enable_mamba_extra_buffer and kv.mamba_ping_pong_track_buffer is None:
                n = self.mamba_ping_pong_track_buffer_size
                kv.mamba_ping_pong_track_buffer = [self._alloc_slot() for _ in range(n)]
                kv.mamba_next_track_idx = 0
                kv.mamba_last_track_idx = self.get_mamba_ping_pong_other_idx(0)
                kv.mamba_prev_track_seqlen = None
            self.req_index_to_mamba_index_mapping[kv.req_pool_idx] = kv.mamba_pool_idx
        return rows

    def get_mamba_ping_pong_other_idx(self, idx: int) -> int:
        return 1 - idx if self.mamba_ping_pong_track_buffer_size == 2 else idx

    def get_mamba_indices(self, rows) -> np.ndarray:
        return self.req_index_to_mamba_index_mapping[np.asarray(rows, dtype=np.int64)]

    def free_mamba_cache(self, req, keep_idx: int | None = None) -> None:
        """Free the request's working slot and its tracking slots except ``keep_idx`` (donated)."""
        kv: ReqKvInfo = req.kv
        if kv.mamba_pool_idx is None:
            raise PoolError("double free of a request's mamba slot")
        self.mamba_allocator.free([kv.mamba_pool_idx])
        kv.mamba_pool_idx = None
        if kv.mamba_ping_pong_track_buffer is not None:
            rest = [s for i, s in enumerate(kv.mamba_ping_pong_track_buffer) if i != keep_idx and s >= 0]
            if rest:
                self.mamba_allocator.free(rest)
            kv.mamba_ping_pong_track_buffer = None
            kv.mamba_next_track_idx = kv.mamba_last_track_idx = None
            kv.mamba_last_track_seqlen = kv.mamba_prev_track_seqlen = None
        kv.mamba_cow_src_index = None

    def check_integrity(self) -> None:
        super().check_integrity()
        self.mamba_pool.check_integrity()
