"""A free list stored as a deque of segments, plus a free/used mask that catches misuse.

SGLang keeps its free lists as one tensor and rebuilds it with ``torch.cat`` on every free,
which is O(pool) per call. The sequence of ids is what matters for fidelity, not its storage,
so here it is a deque of arrays: taking ``n`` ids from the head or adding ids at either end
costs O(n), whatever the pool size.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from poolsim.pools.errors import DoubleFreeError, PoolError

_CONSOLIDATE_AT = 512  # segments; merging them then keeps take() from walking thousands of tiny arrays


class FreeMask:
    """Which ids ``1..capacity`` are free, kept for the checks alone (it never changes an id): a freed id that is
    the padding id 0, out of range, already free or twice in one call is refused, the message naming ``what``."""

    def __init__(self, capacity: int, what: str):
        self.capacity = capacity
        self.what = what
        self.free = np.zeros(capacity + 1, dtype=bool)
        self.free[1:] = True
        self._stamp = np.zeros(capacity + 1, dtype=np.int32)  # scratch for duplicate detection

    def check_freeable(self, host: np.ndarray) -> None:
        if host.size == 0:
            return
        lo, hi = int(host.min()), int(host.max())
        if lo < 1 or hi > self.capacity:
            bad = lo if lo < 1 else hi
            if bad == 0:
                raise PoolError(f"freeing {self.what} 0, the reserved padding {self.what}")
            raise PoolError(f"freeing {self.what} {bad} outside 1..{self.capacity}")
        already = self.free[host]
        if already.any():
            raise DoubleFreeError(f"double free of {self.what} {int(host[already][0])}")
        # Duplicates within the call: with repeated indices the last write wins, so an earlier
        # occurrence reads back a position that is not its own.
        pos = np.arange(host.size)
        self._stamp[host] = pos
        clash = self._stamp[host] != pos
        if clash.any():
            raise DoubleFreeError(f"double free of {self.what} {int(host[clash][0])}")

    def mark(self, host: np.ndarray, free: bool) -> None:
        if len(host):
            self.free[host] = free

    def count(self) -> int:
        return int(self.free.sum())


class FreeList:
    def __init__(self, xp, capacity: int, what: str, checks: bool = True):
        self.xp = xp
        self.capacity = capacity  # ids 1..capacity; id 0 is the reserved padding slot/page
        self.what = what
        # The mask and its double-free checks never change an id; a simulation without --check skips them.
        self.checks = checks
        self.reset()

    def reset(self) -> None:
        self._segs: deque = deque()
        self._len = 0
        self._mask = FreeMask(self.capacity, self.what)
        if self.capacity > 0:
            self._segs.append(self.xp.arange(1, self.capacity + 1))
            self._len = self.capacity

    def __len__(self) -> int:
        return self._len

    def take(self, n: int):
        """Remove and return the first ``n`` ids (caller checked ``n <= len``)."""
        if n <= 0:
            return self.xp.empty()
        head = self._segs[0]
        if len(head) > n:  # the usual case: the head segment alone covers it
            self._segs[0] = head[n:]
            self._len -= n
            out = head[:n]
            if self.checks:
                self._mark(out, free=False)
            return out
        parts, need = [], n
        while need:
            seg = self._segs[0]
            if len(seg) <= need:
                parts.append(seg)
                self._segs.popleft()
                need -= len(seg)
            else:
                parts.append(seg[:need])
                self._segs[0] = seg[need:]
                need = 0
        self._len -= n
        out = self.xp.cat(parts)
        if self.checks:
            self._mark(out, free=False)
        return out

    def push_back(self, ids) -> None:
        self._add(ids, front=False)

    def push_front(self, ids) -> None:
        self._add(ids, front=True)

    def to_array(self):
        return self.xp.cat(list(self._segs)) if self._segs else self.xp.empty()

    def replace(self, ids) -> None:
        """Replace the whole sequence (after a merge-and-sort); ids must already be marked free."""
        self._segs = deque([ids]) if len(ids) else deque()
        self._len = len(ids)

    def mark_free(self, ids) -> None:
        """Mark ids free that are held elsewhere (staged pages), checking for double frees."""
        if self.checks:
            self.check_freeable(ids)
            self._mark(ids, free=True)

    def check_freeable(self, ids) -> np.ndarray:
        host = self.xp.to_numpy(ids)
        self._mask.check_freeable(host)
        return host

    def is_free(self, ids) -> np.ndarray:
        return self._mask.free[self.xp.to_numpy(ids)]

    def num_marked_free(self) -> int:
        return self._mask.count()

    def _add(self, ids, front: bool) -> None:
        n = len(ids)
        if n == 0:
            return
        if self.checks:
            self.check_freeable(ids)
            self._mark(ids, free=True)
        ids = self.xp.keep(ids)  # the caller may reuse its array (SGLang clones); a tree node's never change
        if front:
            self._segs.appendleft(ids)
        else:
            self._segs.append(ids)
        self._len += n
        if len(self._segs) > _CONSOLIDATE_AT:
            self._segs = deque([self.xp.cat(list(self._segs))])

    def _mark(self, ids, free: bool) -> None:
        if len(ids):
            self._mask.mark(self.xp.to_numpy(ids), free)
