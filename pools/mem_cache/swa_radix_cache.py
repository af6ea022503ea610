"""The radix cache of hybrid-SWA models: ``UnifiedRadixCache`` with FULL + SWA components (SGLang 0.5.23
``mem_cache/unified_cache/components/swa.py``, ``unified_tree_core.py``, ``unified_radix_cache.py``;
SGLANG_SWA_DSA.md section 3). Runs on ``SWATokenToKVPoolAllocator``.

What the SWA component adds to the FULL tree:
- a node holds its full-pool slots (``value``) and, separately, the SWA peers of those slots
  (``swa_value``). SWA eviction of an internal node leaves a tombstone: ``swa_value`` None, KV kept;
- a match may only end where the last ``sliding_window`` tokens above it all still have SWA data
  (``create_match_validator``: the run of SWA-backed tokens restarts at every tombstone);
- locks: FULL is path-locked; SWA locks only the segment covering the last window, ended by a uuid
  stamped on the boundary node (a split moves the uuid to the new, older parent);
- eviction is asked for each pool's shortfall: FULL leaves by LRU first (taking their SWA along), then
  the SWA LRU: a leaf is deleted, an internal node is tombstoned. The SWA LRU is its own list, refreshed
  only for the last window above the node a match or insert ended on;
- insert publishes SWA only for ``[swa_evicted_seqlen, end)`` of the request (the part whose SWA KV it
  still holds), capping a new leaf at one page-aligned window so a lock pins one window; an inserted
  range that overlaps a tombstone inside the request's window gives the tombstone SWA KV again.
- a request whose full-KV hit went past its valid prefix first checkpoints only up to that branching point
  (``swa_branching_seqlen``), so the tombstones there take its fresh SWA KV.
Not modelled: sessions, HiCache, the per-request SWA ring, draft-widened windows.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.radix_cache import InsertResult, RadixCache, RadixKey, TreeNode

SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL: decode frees once this many tokens left the window


class SWATreeNode(TreeNode):
    __slots__ = ("swa_value", "swa_lock_ref", "swa_uuid", "lru_prev", "lru_next")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.swa_value: np.ndarray | None = None  # SWA slot per token; None: a tombstone (or not published)
        self.swa_lock_ref = 0
        self.swa_uuid: int | None = None  # marks the older edge of a window lock that ends here
        self.lru_prev = self.lru_next = None


class SWALRUList:
    """The SWA component's LRU (``LRUList``): head side most recent. Nodes with SWA data only."""

    def __init__(self):
        self.head, self.tail = SWATreeNode(-1, None, None, None), SWATreeNode(-2, None, None, None)
        self.head.lru_next, self.tail.lru_prev = self.tail, self.head
        self.members: set = set()

    def _link_after(self, ref, node) -> None:
        node.lru_prev, node.lru_next = ref, ref.lru_next
        ref.lru_next.lru_prev = node
        ref.lru_next = node
        self.members.add(node)

    def remove(self, node) -> None:
        node.lru_prev.lru_next = node.lru_next
        node.lru_next.lru_prev = node.lru_prev
        node.lru_prev = node.lru_next = None
        self.members.discard(node)

    def insert_mru(self, node) -> None:
        if node in self.members:
            self.remove(node)
        self._link_after(self.head, node)

    def insert_after(self, ref, node) -> None:
        """Right behind ``ref``: just less recent than it (a split's new parent beside its child)."""
        self._link_after(ref, node)

    def reset_window_mru(self, node, root, window: int) -> None:
        """``reset_node_and_window_ancestors_mru``: ``node`` becomes the most recent, its ancestors follow
        in order, until ``window`` tokens of path (tombstones counted) have been walked."""
        prev = self.head
        walked = 0
        while node is not root and walked < window:
            if node.swa_value is not None:
                self.remove(node)
                self._link_after(prev, node)
                prev = node
            walked += len(node.key)
            node = node.parent

    def lru_to_mru(self):
        node = self.tail.lru_prev
        while node is not self.head:
            yield node
            node = node.lru_prev


class SWARadixCache(RadixCache):
    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, sliding_window_size: int,
                 page_size: int | None = None):
        if not hasattr(token_to_kv_pool_allocator, "swa_available_size"):
            raise PoolError("SWARadixCache needs an SWATokenToKVPoolAllocator")
        if sliding_window_size is None or sliding_window_size <= 0:
            raise PoolError(f"SWARadixCache needs a positive sliding_window_size, got {sliding_window_size}")
        self.sliding_window_size = sliding_window_size
        self._next_uuid = 0
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size)
        ps = self.page_size
        self.window_tail = -(-sliding_window_size // ps) * ps  # one page-aligned window

    def reset(self) -> None:
        super().reset()
        self.swa_lru = SWALRUList()
        self.swa_evictable_size_ = 0
        self.swa_protected_size_ = 0
        self.num_swa_evicted_tokens = 0
        self._insert_window_start = 0
        self._branch_inserted = False
        self._forward_key_len = 0
        self._swa_run = math.inf

    def supports_swa(self) -> bool:
        return True

    def swa_evictable_size(self) -> int:
        return self.swa_evictable_size_

    def swa_protected_size(self) -> int:
        return self.swa_protected_size_

    def _new_node(self, key, value, parent, extra_key=None) -> SWATreeNode:
        node = SWATreeNode(self._next_id, key, value, parent, extra_key)
        self._next_id += 1
        node.last_access_time = self._tick()
        self._tick()  # creation_time, as RadixCache._new_node
        return node

    # ------------------------------------------------------------------ SWA values
    def _translate(self, full_value: np.ndarray) -> np.ndarray:
        return np.asarray(self.token_to_kv_pool_allocator.translate_loc_from_full_to_swa(full_value),
                          dtype=np.int64).copy()

    def _set_swa_value(self, node: SWATreeNode, swa_value: np.ndarray) -> None:
        """``set_component_device_value``: most recent in the SWA LRU; protected if the node is SWA-locked."""
        node.swa_value = swa_value
        self.swa_lru.insert_mru(node)
        if node.swa_lock_ref > 0:
            self.swa_protected_size_ += len(swa_value)
        else:
            self.swa_evictable_size_ += len(swa_value)

    def _publish(self, node: SWATreeNode) -> None:
        """``SWARebuild``: the node's SWA value is the SWA peers of its full slots."""
        self._set_swa_value(node, self._translate(node.value))

    def _tombstone(self, node: SWATreeNode) -> int:
        """Free the node's SWA peers (through its full slots, as ``evict_component``); the KV stays."""
        if node.swa_lock_ref > 0:
            raise PoolError(f"SWA eviction of node {node.id} that holds an SWA lock")
        n = len(node.swa_value)
        self.token_to_kv_pool_allocator.free_swa(node.value)
        self.swa_lru.remove(node)
        node.swa_value = None
        self.swa_evictable_size_ -= n
        self.num_swa_evicted_tokens += n
        return n

    # ------------------------------------------------------------------ match
    def _begin_match(self) -> None:
        self._swa_run = math.inf  # the validator's state: SWA-backed tokens since the last tombstone

    def _match_valid(self, node: SWATreeNode) -> bool:
        if node.swa_value is None:
            self._swa_run = 0
            return False
        self._swa_run += len(node.key)
        return self._swa_run >= self.sliding_window_size

    def _touch_match(self, best: SWATreeNode) -> None:
        super()._touch_match(best)
        self.swa_lru.reset_window_mru(best, self.root_node, self.sliding_window_size + self.page_size)

    def _finish_match(self, key, values, best, best_values, full_hit, **kwargs):
        result = super()._finish_match(key, values, best, best_values, full_hit)
        aligned = full_hit // self.page_size * self.page_size
        return result._replace(swa_branching_seqlen=aligned if aligned > result.prefix_len else None)

    # ------------------------------------------------------------------ split
    def _split_node(self, child: SWATreeNode, split_len: int) -> SWATreeNode:
        new = super()._split_node(child, split_len)
        new.swa_lock_ref = child.swa_lock_ref
        if child.swa_value is not None:
            new.swa_value, child.swa_value = child.swa_value[:split_len], child.swa_value[split_len:]
            self.swa_lru.insert_after(child, new)
        new.swa_uuid, child.swa_uuid = child.swa_uuid, None
        self._update_leaf_status(new)
        return new

    # ------------------------------------------------------------------ insert
    def insert(self, key: RadixKey, value, prev_prefix_len: int = 0, mamba_value=None,
               swa_evicted_seqlen: int | None = None, from_node=None) -> InsertResult:
        """Insert ``key -> value``; the caller's SWA KV is gone below ``swa_evicted_seqlen`` (default: the
        request being checkpointed). Duplicates from ``prev_prefix_len`` on are freed (full side only below
        that bound); an overlapped tombstone inside the window adopts the caller's slots. ``from_node`` (the
        base tree's shortcut for chunk checkpoints) is not taken: this walk revisits every node for its SWA
        state, and the walk from the root gives the same tree."""
        window_start = self._insert_window_start if swa_evicted_seqlen is None else swa_evicted_seqlen
        key = key.page_aligned(self.page_size)
        value = np.asarray(value, dtype=np.int64)[: len(key)]
        self._touch(self.root_node, self._tick())
        if len(key) == 0:
            return InsertResult(0, self.root_node)
        tokens, extra = key.token_ids, key.extra_key
        alloc = self.token_to_kv_pool_allocator
        node, pos = self.root_node, 0
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens[pos:], extra))
            if child is None:
                break
            self._touch(child, self._tick())
            plen = self._match_len(child.key, tokens[pos:])
            if plen < len(child.key):
                child = self._split_node(child, plen)
            consumed = plen
            if prev_prefix_len < pos + plen:
                consumed = self._recover_tombstone(child, pos, plen, value, window_start)
            dup_start = max(0, prev_prefix_len - pos)
            if dup_start < consumed:
                dup = value[pos + dup_start: pos + consumed]
                swa_gone = min(max(window_start - (pos + dup_start), 0), len(dup))
                alloc.free_full_segment(dup[:swa_gone], start_pos=0)
                alloc.free_segment(dup[swa_gone:], start_pos=0)
            node = child
            pos += plen
        target = node
        if pos < len(tokens):
            target = self._add_new_node(node, tokens[pos:].copy(), value[pos:].copy(), extra)
            self._populate_new_leaf(target, pos, window_start)
        if target is not self.root_node:
            self.swa_lru.reset_window_mru(target, self.root_node, self.sliding_window_size + self.page_size)
        return InsertResult(pos, target)

    def _clip_to_window(self, node: SWATreeNode, start: int, end: int, window_start: int) -> int | None:
        """Where the caller's live SWA begins inside a tombstoned ``[start, end)``; splits the node there
        (``node`` keeps the live tail). None: nothing to give SWA to."""
        if node.swa_value is not None:
            return None
        if window_start % self.page_size:
            raise PoolError(f"swa_evicted_seqlen {window_start} is not page-aligned")
        live_start = max(start, window_start)
        if live_start >= end:
            return None
        if live_start > start:
            self._split_node(node, live_start - start)
        return live_start

    def _recover_tombstone(self, node: SWATreeNode, pos: int, plen: int, value: np.ndarray,
                           window_start: int) -> int:
        """``update_component_on_insert_overlap``: returns how much of the overlap counts as duplicates."""
        live_start = self._clip_to_window(node, pos, pos + plen, window_start)
        if live_start is None:
            return plen
        alloc = self.token_to_kv_pool_allocator
        incoming = value[live_start: pos + plen]
        if node.lock_ref > 0:  # RecoverSWAWithLockedFull: keep the locked full slots, move the SWA peers over
            swa_value = self._translate(incoming)
            alloc.clear_full_to_swa_mapping(incoming)
            alloc.set_full_to_swa_mapping(node.value, swa_value)
            alloc.free_full_segment(incoming, start_pos=0)
            self._set_swa_value(node, swa_value)
        else:  # the node adopts the caller's slots; its old full slots (no SWA peers) go back
            old = node.value
            node.value = incoming.copy()
            alloc.free_full_segment(old, start_pos=0)
            self._publish(node)
        return live_start - pos

    def _populate_new_leaf(self, leaf: SWATreeNode, start: int, window_start: int) -> None:
        """``commit_insert_component_data`` for a new leaf: SWA for its in-window part only, the leaf
        capped at one window (the older part becomes its parent, published first: less recent)."""
        live_start = self._clip_to_window(leaf, start, start + len(leaf.key), window_start)
        if live_start is None:
            return
        parent = None
        if leaf.swa_lock_ref == 0 and len(leaf.key) > self.window_tail:
            parent = self._split_node(leaf, len(leaf.key) - self.window_tail)
        if parent is not None:
            self._publish(parent)
        self._publish(leaf)

    def _split_prompt(self, req, key, last_node) -> None:
        pass  # only a FULL-only tree re-inserts the prompt

    # ------------------------------------------------------------------ request lifecycle
    def _prepare_for_caching(self, req, up_to: int, is_finished: bool):
        """An unfinished request first frees its own SWA KV that left the window (``free_out_of_window_slots``
        with the key's last position); the insert then tombstones what lies below. A request whose full-KV hit
        went past its valid prefix inserts only up to that branching point first, so the tombstones there get
        its fresh SWA KV (``prepare_for_caching_req``)."""
        cache_len = up_to
        branch = req.swa_branching_seqlen
        self._branch_inserted = False
        if branch is not None and req.kv.cache_protected_len < branch <= up_to:
            cache_len = branch
            self._branch_inserted = cache_len // self.page_size * self.page_size >= branch
        self._forward_key_len = up_to
        if not is_finished:
            self.evict_sliding_window(req, cache_len - 1)
        self._insert_window_start = req.kv.swa_evicted_seqlen
        return cache_len, None, None

    def _cleanup_after_caching(self, req, is_finished: bool, result, mamba_value, keep_idx) -> None:
        """``cleanup_after_caching_req``: once the branch is in the tree, forget it and free what left the window
        of the whole forward key."""
        self._insert_window_start = 0
        if result is None or not self._branch_inserted:
            return
        req.swa_branching_seqlen = None
        if not is_finished:
            self.evict_sliding_window(req, self._forward_key_len - 1)

    def evict_sliding_window(self, req, pre_len: int, eviction_interval: int = 1) -> None:
        """``free_swa_out_of_window_slots`` (``mem_cache/common.py:75-137``), prefix-sharing case: free the
        request's own SWA slots from ``swa_evicted_seqlen`` up to a page-aligned window below ``pre_len``."""
        kv = req.kv
        if not kv.holds_kv:
            return
        ps = self.page_size
        evicted = kv.swa_evicted_seqlen
        if pre_len - self.sliding_window_size < evicted + eviction_interval:
            return
        evicted = max(evicted, kv.cache_protected_len)  # swa_dead_lo: the tree owns the rows below
        kv.swa_evicted_seqlen = evicted
        threshold = pre_len - -(-max(self.sliding_window_size, ps) // ps) * ps
        new_evicted = max(evicted, threshold) // ps * ps
        if new_evicted > evicted:
            row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
            self.token_to_kv_pool_allocator.free_swa_segment(
                np.asarray(row[evicted:new_evicted], dtype=np.int64), start_pos=evicted)
            kv.swa_evicted_seqlen = new_evicted

    def free_kv_row(self, kv, start: int, end: int) -> None:
        """``free_kv_row_segments``: ``[swa_dead_lo, swa_evicted_seqlen)`` goes back on the full side only."""
        if end <= start:
            return
        row = np.asarray(self.req_to_token_pool.req_to_token[kv.req_pool_idx, start:end], dtype=np.int64)
        alloc = self.token_to_kv_pool_allocator
        lo = min(max(kv.cache_protected_len, start), end)
        hi = min(max(kv.swa_evicted_seqlen, kv.cache_protected_len, start), end)
        if hi > lo:
            if lo > start:
                alloc.free_segment(row[: lo - start], start_pos=start)
            alloc.free_full_segment(row[lo - start: hi - start], start_pos=lo)
            alloc.free_segment(row[hi - start:], start_pos=hi)
        else:
            alloc.free_segment(row, start_pos=start)

    def on_release(self, req, checkpointed: bool) -> None:
        req.kv.swa_evicted_seqlen = 0  # mark_kv_released

    # ------------------------------------------------------------------ locks
    def lock(self, node: SWATreeNode):
        self.inc_lock_ref(node)
        return node, self._acquire_window_lock(node)

    def unlock(self, lock) -> None:
        if lock is not None:
            node, uuid = lock
            self._release_window_lock(node, uuid)
            self.dec_lock_ref(node)

    def _acquire_window_lock(self, node: SWATreeNode) -> int | None:
        """``acquire_component_lock``: lock every node of the segment covering the last window; the node
        where the window is reached gets a uuid that ends the matching release."""
        covered, uuid = 0, None
        while node is not self.root_node and covered < self.sliding_window_size:
            if node.swa_lock_ref == 0 and node.swa_value is not None:
                self.swa_evictable_size_ -= len(node.swa_value)
                self.swa_protected_size_ += len(node.swa_value)
            node.swa_lock_ref += 1
            self.evictable_leaves.discard(node)
            covered += len(node.key)
            if covered >= self.sliding_window_size:
                if node.swa_uuid is None:
                    node.swa_uuid = self._next_uuid
                    self._next_uuid += 1
                uuid = node.swa_uuid
            node = node.parent
        return uuid

    def _release_window_lock(self, node: SWATreeNode, uuid: int | None) -> None:
        while node is not self.root_node:
            if node.swa_lock_ref <= 0:
                raise PoolError(f"SWA unlock of node {node.id} whose SWA lock_ref is already 0")
            if node.swa_lock_ref == 1 and node.swa_value is not None:
                self.swa_evictable_size_ += len(node.swa_value)
                self.swa_protected_size_ -= len(node.swa_value)
            node.swa_lock_ref -= 1
            if node.swa_lock_ref == 0:
                self._update_leaf_status(node)
            if uuid is not None and node.swa_uuid == uuid:
                break
            node = node.parent

    def _is_leaf(self, node) -> bool:
        return super()._is_leaf(node) and node.swa_lock_ref == 0

    # ------------------------------------------------------------------ eviction
    def _delete_leaf(self, node: SWATreeNode) -> int:
        """A FULL leaf eviction takes the node's SWA along (a tombstone leaf frees its full slots only)."""
        n = len(node.value)
        alloc = self.token_to_kv_pool_allocator
        if node.swa_value is not None:
            self.swa_lru.remove(node)
            self.swa_evictable_size_ -= len(node.swa_value)
            self.num_swa_evicted_tokens += len(node.swa_value)
            node.swa_value = None
            alloc.free_segment(node.value, start_pos=0)
        else:
            alloc.free_full_segment(node.value, start_pos=0)
        self.evictable_size_ -= n
        self.num_evicted_tokens += n
        parent = node.parent
        del parent.children[self._child_key_of(node)]
        self.evictable_leaves.discard(node)
        self._update_leaf_status(parent)
        return n

    def evict(self, num_tokens: int) -> int:
        return self.evict_for_pools(num_tokens, 0)

    def evict_for_alloc(self, num_tokens: int) -> int:
        return self.evict_for_pools(num_tokens, 0)

    def evict_for_pools(self, full_tokens: int, swa_tokens: int) -> int:
        """``evict_for_alloc`` with each pool's shortfall: FULL leaves (LRU) until the full pool has
        ``full_tokens`` more free, then the SWA LRU until the SWA pool has ``swa_tokens`` more (SWA freed by
        the FULL pass counts). Returns full tokens evicted."""
        alloc = self.token_to_kv_pool_allocator
        full_target = alloc.full_available_size() + full_tokens
        swa_target = alloc.swa_available_size() + swa_tokens
        swa_before = self.num_swa_evicted_tokens
        evicted = 0
        if full_tokens > 0:
            if len(self._leaf_heap) > 4 * len(self.evictable_leaves) + 1024:  # drop stale entries, as evict()
                self._leaf_heap = [(n.last_access_time, n.id, n) for n in self.evictable_leaves]
                heapq.heapify(self._leaf_heap)
            while alloc.full_available_size() < full_target:
                node = self._pop_lru_leaf()
                if node is None:
                    break
                evicted += self._delete_leaf(node)
        if swa_tokens <= 0 or alloc.swa_available_size() >= swa_target \
                or self.num_swa_evicted_tokens - swa_before >= swa_tokens:
            return evicted
        node, head = self.swa_lru.tail.lru_prev, self.swa_lru.head  # a cursor from the LRU end
        while node is not head and self.num_swa_evicted_tokens - swa_before < swa_tokens:
            newer = node.lru_prev  # evicting ``node`` unlinks only itself
            if node.swa_lock_ref == 0:
                if node in self.evictable_leaves:
                    evicted += self._delete_leaf(node)
                else:
                    self._tombstone(node)
                if alloc.swa_available_size() >= swa_target:
                    break
            node = newer
        return evicted

    # ------------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        super().check_integrity()
        ev = prot = 0
        seen = set()
        stack = list(self.root_node.children.values())
        mapping = self.token_to_kv_pool_allocator.full_to_swa_index_mapping
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.swa_lock_ref < 0:
                raise PoolError(f"node {node.id}: SWA lock_ref {node.swa_lock_ref}")
            if node.swa_value is None:
                if (mapping[node.value] != 0).any():
                    raise PoolError(f"tombstone node {node.id} still maps full slots to SWA slots")
                continue
            seen.add(node)
            if len(node.swa_value) != len(node.value) or (mapping[node.value] != node.swa_value).any():
                raise PoolError(f"node {node.id}: SWA value disagrees with the full->SWA mapping")
            if node.swa_lock_ref:
                prot += len(node.swa_value)
            else:
                ev += len(node.swa_value)
        if seen != self.swa_lru.members:
            raise PoolError("SWA LRU membership disagrees with the nodes holding SWA data")
        if (ev, prot) != (self.swa_evictable_size_, self.swa_protected_size_):
            raise PoolError(f"SWA evictable/protected {self.swa_evictable_size_}/{self.swa_protected_size_} "
                            f"but the tree holds {ev}/{prot}")
