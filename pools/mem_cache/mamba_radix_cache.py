"""The radix cache of hybrid linear-attention models: ``UnifiedRadixCache`` with FULL + MAMBA components
(docs/sglang.md 7.5; ``unified_cache/components/mamba.py``).

What the mamba component adds to the FULL tree:
- a node may hold one state slot: the recurrent state after the node's last token;
- a match may only end on a node holding a state (the FULL hit may go further: ``full_kv_hit_length``,
  and the chunk-grid-aligned point inside it is the ``mamba_branching_seqlen``);
- a matched state is copied into the request's own slot (copy-on-write), never shared in place;
- locks: FULL is path-locked, MAMBA locks the matched node only;
- eviction: FULL leaves go by LRU and take their state with them; the mamba walk goes by its own
  LRU list (refreshed only for the node a match used), tombstones the state of an internal node
  (its KV stays) and deletes a leaf outright.
Strategies: ``no_buffer`` (page size 1; states exist where a request was checkpointed or finished)
and ``extra_buffer`` (every request also holds ping-pong slots; the forward checkpoints the state on
the chunk grid during prefill and every ``mamba_track_interval`` tokens during decode).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import Any

from poolsim.pools.errors import MambaCapacityError, PoolError
from poolsim.pools.mem_cache.radix_cache import MatchResult, RadixCache, TreeNode
from poolsim.pools.mem_cache.req_kv import ReqKvInfo

FLA_CHUNK_SIZE = 64  # tokens; KDA/GDN chunked kernels' chunk, SGLang's mamba cache chunk size floor


class MambaRadixCache(RadixCache):
    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size: int | None = None,
                 strategy: str = "no_buffer", mamba_track_interval: int = 256):
        if strategy not in ("no_buffer", "extra_buffer"):
            raise PoolError(f"mamba strategy must be no_buffer or extra_buffer, got {strategy!r}")
        ps = page_size or token_to_kv_pool_allocator.page_size
        if strategy == "no_buffer" and ps != 1:
            raise PoolError(f"the no_buffer mamba cache needs page_size 1 (got {ps}); SGLang asserts this")
        if (strategy == "extra_buffer") != req_to_token_pool.enable_mamba_extra_buffer:
            raise PoolError("strategy extra_buffer needs a HybridReqToTokenPool with ping-pong slots, and only it")
        self.strategy = strategy
        self.mamba_cache_chunk_size = max(FLA_CHUNK_SIZE, ps)
        self.mamba_checkpoint_grid = math.lcm(self.mamba_cache_chunk_size, ps)
        self.mamba_track_grid = math.lcm(self.mamba_checkpoint_grid, mamba_track_interval)
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, ps)

    def reset(self) -> None:
        super().reset()
        self.mamba_lru: OrderedDict[int, TreeNode] = OrderedDict()  # first = least recently used
        # The unlocked part of mamba_lru in the same order, for eviction: (stamp, push number, node) entries, stamps
        # rising with every append/move_to_end, so the smallest valid entry is the first unlocked node of mamba_lru.
        # Entries go stale (node moved, locked or freed) and are dropped when they reach the top; a node unlocked
        # again is pushed anew (the push number keeps two entries of one node from comparing nodes). Scanning
        # mamba_lru past the locked nodes at its head instead cost O(locked) per eviction.
        self._mamba_unlocked: list[tuple[int, int, TreeNode]] = []
        self._mamba_stamp = 0
        self._mamba_pushes = 0
        self.mamba_evictable_size_ = 0
        self.mamba_protected_size_ = 0

    def supports_mamba(self) -> bool:
        return True

    def mamba_evictable_size(self) -> int:
        return self.mamba_evictable_size_

    def mamba_protected_size(self) -> int:
        return self.mamba_protected_size_

    @property
    def mamba_allocator(self) -> Any:
        return self.req_to_token_pool.mamba_allocator

    # ------------------------------------------------------------------ match
    def _match_valid(self, node: TreeNode) -> bool:
        return node.mamba_value is not None

    def _touch_match(self, best: TreeNode) -> None:
        super()._touch_match(best)
        if best.mamba_value is not None:
            self.mamba_lru.move_to_end(best.id)
            self._mamba_touched(best)

    def _finish_match(self, key, values, best, best_values, full_hit, req=None, cow_mamba=False,
                      **kwargs) -> MatchResult:
        result = super()._finish_match(key, values, best, best_values, full_hit)
        grid = self.mamba_checkpoint_grid
        aligned = full_hit // grid * grid
        result = result._replace(mamba_branching_seqlen=aligned if aligned > result.prefix_len else None)
        if cow_mamba and req is not None and best.mamba_value is not None:
            if not req.kv.holds_mamba:
                slot = self.mamba_allocator.alloc_one()
                if slot is None:
                    self.inc_lock_ref(best)  # keep the source state while making room
                    self.evict_mamba(1)
                    slot = self.mamba_allocator.alloc_one()
                    self.dec_lock_ref(best)
                    if slot is None:
                        raise MambaCapacityError("Can not alloc mamba cache for a prefix hit")
                req.kv.mamba_pool_idx = slot
            req.kv.mamba_cow_src_index = best.mamba_value
        return result

    # ------------------------------------------------------------------ insert
    def _commit_insert(self, node: TreeNode, is_new_leaf: bool, mamba_value: int | None) -> bool:
        if mamba_value is None:
            raise PoolError("a mamba tree insert needs a state slot")
        if is_new_leaf or node.mamba_value is None:
            node.mamba_value = mamba_value
            self.mamba_lru[node.id] = node
            self._mamba_touched(node)
            if node.mamba_lock_ref > 0:
                self.mamba_protected_size_ += 1
            else:
                self.mamba_evictable_size_ += 1
            if not is_new_leaf:
                self._touch(node, self._tick())
            return False
        self.mamba_lru.move_to_end(node.id)
        self._mamba_touched(node)
        self._touch(node, self._tick())
        return True

    def _mamba_touched(self, node: TreeNode) -> None:
        """``node`` was just appended or moved to the end of mamba_lru."""
        self._mamba_stamp += 1
        node.mamba_lru_stamp = self._mamba_stamp
        if node.mamba_lock_ref == 0:
            self._push_unlocked(node)

    def _push_unlocked(self, node: TreeNode) -> None:
        heap = self._mamba_unlocked
        if len(heap) > 2 * len(self.mamba_lru) + 64:  # mostly stale: rebuild from the live entries
            heap[:] = [(n.mamba_lru_stamp, 0, n) for n in self.mamba_lru.values() if n.mamba_lock_ref == 0
                       and n is not node]  # one entry per node: stamps unique, nodes never compared
            heapq.heapify(heap)
        self._mamba_pushes += 1
        heapq.heappush(heap, (node.mamba_lru_stamp, self._mamba_pushes, node))

    def _split_prompt(self, req, key, last_node) -> None:
        pass  # only a FULL-only tree re-inserts the prompt

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: TreeNode) -> int:
        if node is not self.root_node:
            if node.mamba_lock_ref == 0 and node.mamba_value is not None:
                self.mamba_evictable_size_ -= 1
                self.mamba_protected_size_ += 1
            node.mamba_lock_ref += 1
        return super().inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode) -> int:
        if node is not self.root_node:
            if node.mamba_lock_ref <= 0:
                raise PoolError(f"mamba unlock of node {node.id} whose mamba lock_ref is already 0")
            node.mamba_lock_ref -= 1
            if node.mamba_lock_ref == 0 and node.mamba_value is not None:
                self.mamba_evictable_size_ += 1
                self.mamba_protected_size_ -= 1
                self._push_unlocked(node)
        return super().dec_lock_ref(node)

    # ------------------------------------------------------------------ eviction
    def _release_mamba(self, node: TreeNode) -> None:
        if node.mamba_value is not None:
            self.mamba_allocator.free([node.mamba_value])
            del self.mamba_lru[node.id]
            node.mamba_value = None
            self.mamba_evictable_size_ -= 1

    def evict_mamba(self, num: int) -> int:
        """Free ``num`` state slots, least recently used first: an internal node loses only its state,
        a leaf is deleted with its KV. Returns states freed."""
        freed = 0
        heap, lru = self._mamba_unlocked, self.mamba_lru
        while freed < num:
            victim = None
            while heap:
                stamp, _, node = heapq.heappop(heap)
                if node.mamba_lock_ref == 0 and node.mamba_lru_stamp == stamp and lru.get(node.id) is node:
                    victim = node
                    break
            if victim is None:
                break
            if victim in self.evictable_leaves:
                self.num_mamba_evicted_tokens += self._delete_leaf(victim)
            else:
                self._release_mamba(victim)
            freed += 1
        return freed

    def _alloc_mamba_slot(self) -> int:
        slot = self.mamba_allocator.alloc_one()
        if slot is None:
            self.evict_mamba(1)
            slot = self.mamba_allocator.alloc_one()
            if slot is None:
                raise MambaCapacityError("Can not alloc mamba cache")
        return slot

    # ------------------------------------------------------------------ request lifecycle
    def _prepare_for_caching(self, req, up_to: int, is_finished: bool):
        kv: ReqKvInfo = req.kv
        pool = self.req_to_token_pool
        if self.strategy == "no_buffer":
            if is_finished:
                return up_to, kv.mamba_pool_idx, None  # hand the request's own slot over
            fork = self._alloc_mamba_slot()
            pool.mamba_pool.copy_from([kv.mamba_pool_idx], [fork])
            return up_to, fork, None
        cache_len = kv.mamba_last_track_seqlen
        if is_finished:
            keep = kv.mamba_last_track_idx
            cache_len = cache_len or 0
            if cache_len > up_to:  # the newest checkpoint ran past the key: fall back to the other slot
                prev = kv.mamba_prev_track_seqlen
                if pool.mamba_ping_pong_track_buffer_size != 2 or prev is None or prev > up_to:
                    return 0, None, None
                cache_len, keep = prev, pool.get_mamba_ping_pong_other_idx(keep)
            return cache_len, kv.mamba_ping_pong_track_buffer[keep], keep  # type: ignore[index]  # extra_buffer
        if cache_len is None:
            return 0, None, None
        new_slot = self._alloc_mamba_slot()
        donated = kv.mamba_ping_pong_track_buffer[kv.mamba_last_track_idx]  # type: ignore[index]
        kv.mamba_ping_pong_track_buffer[kv.mamba_last_track_idx] = new_slot  # type: ignore[index]  # keep tracking in a fresh slot
        return cache_len, donated, kv.mamba_last_track_idx

    def _cleanup_after_caching(self, req, is_finished: bool, result, mamba_value, keep_idx) -> None:
        kv: ReqKvInfo = req.kv
        pool = self.req_to_token_pool
        inserted = result is not None and not result.mamba_exist
        if is_finished:
            if self.strategy == "extra_buffer":
                pool.free_mamba_cache(req, keep_idx=keep_idx if inserted else None)
            elif inserted:
                kv.mamba_pool_idx = None  # the slot now belongs to the tree
            else:
                pool.free_mamba_cache(req)
            return
        if mamba_value is not None and not inserted:
            self.mamba_allocator.free([mamba_value])
        kv.mamba_last_track_seqlen = None
        kv.mamba_prev_track_seqlen = None

    def on_release(self, req, checkpointed: bool) -> None:
        if not checkpointed and req.kv.holds_mamba:
            self.req_to_token_pool.free_mamba_cache(req)

    # ------------------------------------------------------------------ extra_buffer checkpoints
    def track_after_extend(self, req, prefix_len: int, extend_end: int) -> None:
        """The prefill forward checkpoints the state on the chunk grid (at the branching point when
        that comes first) into the next ping-pong slot."""
        if self.strategy != "extra_buffer":
            return
        grid = self.mamba_checkpoint_grid
        extend_len = extend_end - prefix_len
        if extend_len < grid:
            return
        seqlen = prefix_len + extend_len // grid * grid
        branch = getattr(req, "mamba_branching_seqlen", None)
        if (branch is not None and prefix_len < branch < extend_end
                and (branch - prefix_len) % self.mamba_cache_chunk_size == 0):
            seqlen = branch
        self._record_track(req, seqlen)

    def decode_tracks(self, reqs, kvs: list[ReqKvInfo] | None = None) -> dict[Any, tuple[int, int]]:
        """A decode forward that reaches the track grid writes the state into the next ping-pong slot, and the
        next forward writes the other one. The checkpoint exists only once the result is processed
        (``commit_decode_track``, SGLang's ``_handle_finish_state_updated_req``), one step later under overlap:
        for a decode batch, ``{req: (ping-pong position, sequence length)}`` of the requests on the grid (none
        unless the strategy is extra_buffer). One pass, no call per request: it runs every decode step. ``kvs``:
        the requests' ``ReqKvInfo`` in the same order, when the caller has them (read natively when compiled)."""
        if self.strategy != "extra_buffer":
            return {}
        grid, other = self.mamba_track_grid, self.req_to_token_pool.get_mamba_ping_pong_other_idx
        tracks: dict = {}
        if kvs is None:
            kvs = [req.kv for req in reqs]
        for req, kv in zip(reqs, kvs):
            if kv.kv_committed_len % grid == 0:
                position = kv.mamba_next_track_idx
                kv.mamba_next_track_idx = other(position)
                tracks[req] = (position, kv.kv_committed_len)  # requests hash by identity: no boxed id()
        return tracks

    def track_after_decode(self, req) -> tuple[int, int] | None:
        """``decode_tracks`` for one request: its track, or None off the grid."""
        return self.decode_tracks((req,)).get(req)

    def commit_decode_track(self, req, track: tuple[int, int]) -> None:
        """The decode's result landed: its checkpoint becomes the newest; the previous one stays named."""
        kv: ReqKvInfo = req.kv
        kv.mamba_last_track_idx = track[0]
        kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
        kv.mamba_last_track_seqlen = track[1]

    def _record_track(self, req, seqlen: int) -> None:
        kv: ReqKvInfo = req.kv
        pool = self.req_to_token_pool
        kv.mamba_last_track_idx = kv.mamba_next_track_idx
        kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(kv.mamba_next_track_idx)
        kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
        kv.mamba_last_track_seqlen = seqlen

    # ------------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        super().check_integrity()
        ev = prot = 0
        for node in self.mamba_lru.values():
            if node.mamba_value is None:
                raise PoolError(f"node {node.id} is in the mamba LRU without a state")
            if node.mamba_lock_ref:
                prot += 1
            else:
                ev += 1
        if (ev, prot) != (self.mamba_evictable_size_, self.mamba_protected_size_):
            raise PoolError(f"mamba evictable/protected {self.mamba_evictable_size_}/{self.mamba_protected_size_} "
                            f"but the tree holds {ev}/{prot}")
